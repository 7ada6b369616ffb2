//! The bytes a job needs, item by item, on the host and on each device.

use std::fmt::Write as _;

use burn_offload::ops::attention;
use burn_offload::Compute;
use models::ModelConfig;

use super::job::{Job, Machine};
use super::knobs::{OptimState, F32};

pub(super) const GIB: f64 = (1u64 << 30) as f64;

/// Device bytes one kept block graph holds through the step: the block's
/// weights (bound until its backward) and the values its backward reads,
/// none of the backward's own temporaries. Attention keeps no `[b, h, t, t]`
/// tensor (`burn_offload::ops::attention`). On the H100 a kept block cost 0.88 of
/// this estimate (0.85B fp32 at 16k tokens, 15 blocks kept at 54,751 MiB
/// against 11,423 with none), so the estimate also covers the
/// pools' page rounding; a GPU filled to the last page by kept graphs would
/// fail mid-step. (With the earlier attention, which kept the weights, a
/// kept block measured 1.04–1.23 times its values.)
pub fn kept_graph_bytes(job: &Job) -> u64 {
    let s = shape(&job.config);
    let (b, t) = (job.batch as u64, job.seq_len as u64);
    let width = job.compute.bytes() as u64;
    width * (s.block_params + b * t * s.saved_per_token(job.mlp_tile))
}

/// Device bytes one recomputed block's kept attention output holds until
/// its backward: the output (`[tokens, query width]` in the compute
/// precision) and an f32 log-sum-exp per token and query head.
pub fn kept_attention_bytes(job: &Job) -> u64 {
    let s = shape(&job.config);
    let tokens = (job.batch * job.seq_len) as u64;
    tokens * (job.compute.bytes() as u64 * s.q + F32 * s.heads)
}

/// One line of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub what: &'static str,
    pub bytes: u64,
    /// A phase's working memory: of these, only the largest counts.
    pub phase: bool,
}

impl Item {
    fn held(what: &'static str, bytes: u64) -> Self {
        Self {
            what,
            bytes,
            phase: false,
        }
    }

    fn phase(what: &'static str, bytes: u64) -> Self {
        Self {
            what,
            bytes,
            phase: true,
        }
    }
}

const CONTEXT: &str = "CUDA context and allocator pools";

/// The share of a GPU's memory that cubecl's pools reserve as soon as each
/// page class is used once (pages of 1/16, 1/64, 1/256, ... of the device).
const POOL_FLOOR_FRACTION: f64 = 1.0 / 16.0 + 1.0 / 64.0 + 1.0 / 256.0 + 1.0 / 1024.0;

/// Predicted memory of a job.
#[derive(Debug, Clone)]
pub struct Plan {
    pub host: Vec<Item>,
    pub device: Vec<Item>,
    /// Parameters, for bytes/param.
    pub params: u64,
    /// Devices the job trains on: each holds `device`.
    pub devices: u64,
}

/// Shape facts the estimate needs, for either architecture.
pub(crate) struct Shape {
    pub(crate) vocab: u64,
    pub(crate) d: u64,
    /// Width of the queries and of attention's output (`d` unless the
    /// heads' width says otherwise).
    pub(crate) q: u64,
    pub(crate) layers: u64,
    pub(crate) heads: u64,
    /// Width of the keys (and of the values).
    pub(crate) kv: u64,
    pub(crate) block_params: u64,
    pub(crate) stem_params: u64,
    pub(crate) largest_tensor: u64,
    /// Values a block keeps for its backward, per token (attention keeps no
    /// `[seq, seq]` scores: see `burn_offload::ops::attention`).
    pub(crate) saved_per_token: u64,
    /// Of those, the MLP's intermediate values, which an MLP over tiles of
    /// tokens does not keep; 0 where the MLP cannot be tiled.
    pub(crate) mlp_per_token: u64,
    /// The MLP's hidden width.
    pub(crate) ff: u64,
}

impl Shape {
    /// Values a block keeps for its backward per token, with the MLP over
    /// tiles or not.
    fn saved_per_token(&self, mlp_tile: Option<usize>) -> u64 {
        match mlp_tile {
            Some(_) => self.saved_per_token - self.mlp_per_token,
            None => self.saved_per_token,
        }
    }
}

pub(crate) fn shape(config: &ModelConfig) -> Shape {
    match config {
        ModelConfig::Llama(c) => {
            let (d, kv) = (c.d_model as u64, (c.n_kv_head * c.head_dim()) as u64);
            let q = (c.n_head * c.head_dim()) as u64;
            let ff = c.d_ff as u64;
            let vocab = c.vocab_size as u64;
            Shape {
                vocab,
                d,
                q,
                layers: c.n_layer as u64,
                heads: c.n_head as u64,
                kv,
                block_params: c.block_params() as u64,
                stem_params: c.stem_params() as u64,
                largest_tensor: (vocab * d).max(ff * d),
                // The block input and the first norm 3d; attention's q, k,
                // v, output and log-sum-exp q+2kv+q+heads; the o-proj input
                // q; the residual and second norm 3d; SwiGLU 5ff (gate, its
                // sigmoid, silu, up, their product).
                saved_per_token: 3 * d + (2 * q + 2 * kv + c.n_head as u64) + q + 3 * d + 5 * ff,
                mlp_per_token: if c.mlp_bias { 0 } else { 5 * ff },
                ff,
            }
        }
        ModelConfig::Gpt2(c) => {
            let d = c.d_model as u64;
            let vocab = c.vocab_size as u64;
            Shape {
                vocab,
                d,
                q: d,
                layers: c.n_layer as u64,
                heads: c.n_head as u64,
                kv: d,
                block_params: c.block_params() as u64,
                stem_params: c.stem_params() as u64,
                largest_tensor: vocab * d,
                // LayerNorms 2×3d, qkv 3d, attention out, proj and residuals 4d, GELU MLP 3×4d.
                saved_per_token: 6 * d + 3 * d + 4 * d + 12 * d,
                mlp_per_token: 0,
                ff: 4 * d,
            }
        }
    }
}

impl Plan {
    pub fn new(job: &Job) -> Self {
        let s = shape(&job.config);
        let params = job.config.num_params() as u64;
        // Those with a gradient and optimizer state.
        let trained = job.trained_params.unwrap_or(params);
        let tokens = (job.batch * job.seq_len) as u64;
        let (b, t) = (job.batch as u64, job.seq_len as u64);
        // Bytes of one device value (weights, activations, checkpoints).
        let width = job.compute.bytes() as u64;
        // Attention's temporaries on the path that will run it.
        let head_dim = (s.q / s.heads.max(1)) as usize;
        let scores = attention::backward_scratch_bytes(
            b as usize,
            s.heads as usize,
            (s.kv / head_dim.max(1) as u64) as usize,
            t as usize,
            head_dim,
            job.compute.dtype(),
            job.cudnn,
        ) as u64;
        let block_saved = width * tokens * s.saved_per_token(job.mlp_tile);
        // An MLP over tiles holds one tile's six `[tile, ff]` values in its
        // backward (the projections recomputed, the gate, their gradients)
        // and the f32 sums of the three weights' gradients.
        let mlp_tile = match job.mlp_tile {
            Some(tile) => width * 6 * (tile as u64).min(tokens) * s.ff + F32 * 3 * s.d * s.ff,
            None => 0,
        };
        // Beside the saved values, a block's backward holds their gradients
        // and its temporaries: 1.25 times the saved values (the whole
        // recompute + backward at 2.25 times fits the H100 peaks of the
        // 0.85B at 4k and 16k tokens).
        let backward_temporaries = block_saved * 5 / 4 + scores + mlp_tile;
        let block_backward = block_saved + backward_temporaries;
        let chunk = (job.loss_chunk_tokens as u64).clamp(1, tokens);
        // Logits, log-softmax (and its max/exp/sum), their gradient.
        let loss_chunk = F32 * 5 * chunk * s.vocab;
        // A trained head's weight gradient, summed over the chunks.
        let head_gradient = if job.frozen_stem {
            0
        } else {
            F32 * s.vocab * s.d
        };
        // The context, loaded kernels and libraries' workspaces; under
        // `--gpu-mem-gib` also pages the driver has not yet taken back:
        // what the budget keeps cubecl's pools below
        // (`cuda_backend::limit_memory_pages`).
        let runtime_device = match (job.gpu, job.gpu_budget) {
            (false, _) => 0,
            (true, false) => (1.0 * GIB) as u64,
            (true, true) => (2.0 * GIB) as u64,
        };

        // The engine holds a frozen base apart, in its own format.
        let frozen_base = job.frozen_host_bytes.filter(|_| !job.resident);
        let master = if frozen_base.is_some() {
            trained
        } else {
            params
        };
        let mut host = vec![
            Item::held("parameters (fp32 master weights)", F32 * master),
            Item::held(
                if job.optim_state == OptimState::EightBit {
                    "Adam m and v (8-bit, a scale per 256)"
                } else {
                    "Adam m and v (fp32)"
                },
                job.optim_state.bytes(trained),
            ),
        ];
        if let Some(bytes) = frozen_base {
            host.push(Item::held("frozen base (--base-dtype)", bytes));
        }
        let mut device = Vec::new();
        // The type parameter (`--host-params`) runs each block as a
        // checkpoint: its input goes to host memory, its graph is rebuilt in
        // the backward, and its parameters' gradients are sent to the host as
        // they are made. The stem's (embedding, head, final norm) stay.
        let block_grads = (s.layers * s.block_params).min(trained);
        if job.resident && job.host_params {
            device.push(if job.recomputes_blocks() {
                Item::held(
                    "gradients of the stem (until the step) and of one recomputed block",
                    F32 * (trained - block_grads + s.block_params.min(trained)),
                )
            } else {
                Item::held(
                    "gradients (every trained parameter's, until the step)",
                    F32 * trained,
                )
            });
            // The H100 runs of the 0.85B grew by about twice the cache's
            // bytes when it grew: the next step's page-ins arrive while the
            // updated parameters' old copies are still cached.
            device.push(Item::held(
                "parameter cache (weights paged in, and the next step's)",
                2 * job.param_cache.bytes(),
            ));
        } else if job.resident && trained < params {
            device.push(Item::held(
                "parameters (the frozen base)",
                F32 * (params - trained),
            ));
            device.push(Item::held(
                "trained parameters (adapters), gradients, Adam m and v",
                4 * F32 * trained,
            ));
        } else if job.resident {
            device.push(Item::held(
                "parameters, gradients, Adam m and v",
                4 * F32 * params,
            ));
        }
        if job.resident {
            if job.accum > 1 {
                device.push(Item::held(
                    "gradients summed over the micro-batches",
                    F32 * trained,
                ));
            }
            if job.compute != Compute::Fp32 {
                device.push(Item::held(
                    "parameters cast for the forward",
                    width * params,
                ));
            }
            device.push(if job.recomputes_blocks() {
                Item::held(
                    "activations of one block (its graph, rebuilt in the backward)",
                    block_saved,
                )
            } else {
                Item::held(
                    "activations of every block (one graph)",
                    s.layers * block_saved,
                )
            });
            device.push(Item::phase(
                "one block's backward temporaries",
                backward_temporaries,
            ));
            device.push(Item::held(
                "logits and loss (whole batch)",
                F32 * 5 * tokens * s.vocab,
            ));
            if job.host_params {
                // `host` already holds the weights and both moments.
                host.push(Item::held(
                    "gradient copies queued for the host optimizer",
                    (F32 * trained).min(burn_offload::HOST_GRADIENTS_QUEUED),
                ));
                if job.recomputes_blocks() {
                    host.push(Item::held(
                        "recomputed blocks' gradients (fp32, until the step)",
                        F32 * block_grads,
                    ));
                    host.push(Item::held(
                        "block inputs (the checkpoints' stashes)",
                        s.layers * width * tokens * s.d,
                    ));
                }
            } else {
                // Resident training keeps its state on the device; the host
                // holds only the initial copy burn makes while building it.
                host = vec![Item::held("parameters while building (fp32)", F32 * params)];
            }
        } else {
            if job.fused {
            } else if frozen_base.is_some() {
                host.push(Item::held(
                    "gradient buffer (fp32, adapters)",
                    F32 * trained,
                ));
            } else if job.compact_gradients() {
                let blocks = s.layers * s.block_params;
                host.push(Item::held(
                    "gradient buffer (blocks in the compute precision, stem fp32)",
                    width * blocks + F32 * (params - blocks),
                ));
            } else {
                host.push(Item::held("gradient buffer (fp32)", F32 * params));
            }
            if job.compute != Compute::Fp32 && !job.compact() {
                host.push(Item::held(
                    "weights in the compute precision (uploaded)",
                    width * master,
                ));
            }
            // With a frozen base only the adapters' gradients travel.
            let block_gradients = match frozen_base {
                Some(_) => trained / s.layers.max(1),
                None => s.block_params,
            };
            host.push(Item::held(
                "gradients in flight (two blocks and the stem)",
                F32 * (2 * block_gradients + s.stem_params),
            ));
            host.push(Item::held(
                "download staging (largest tensor)",
                F32 * s.largest_tensor,
            ));
            // The embedding phases bind the stem from the f32 weights. On a
            // GPU a dropped block's buffers stay reserved until a later bind
            // has waited for its last kernels (`cuda::UploadPool`).
            let blocks = if job.gpu { 3 } else { 2 };
            // Compact: the blocks arrive in fp32 and two are cast at a time.
            let block_bytes = if job.compact() {
                (F32 * blocks + width * 2) * s.block_params
            } else {
                width * blocks * s.block_params
            };
            // A frozen stem is bound in the compute precision, as a frozen
            // block is; a trained one from the f32 weights.
            let stem_width = if job.frozen_stem && frozen_base.is_some() {
                width
            } else {
                F32
            };
            device.push(Item::held(
                if job.gpu {
                    "weights: stem + three blocks (bound, copying, retiring)"
                } else {
                    "weights: stem + two blocks"
                },
                stem_width * s.stem_params + block_bytes,
            ));
            // A quantised base arrives as codes, dequantised on the device
            // into the compute precision: each block in flight holds both.
            if let Some(bytes) = frozen_base.filter(|&b| b < width * (params - trained)) {
                device.push(Item::held(
                    "the base's codes of those blocks (int8/NF4)",
                    blocks * bytes / s.layers.max(1),
                ));
            }
            let checkpoint = width * tokens * s.d;
            let on_host = job.host_block_inputs(s.layers);
            if on_host > 0 {
                // In host memory the device stays flat in depth; every
                // device keeps its own micro-batch's.
                host.push(Item::held(
                    "block-input checkpoints",
                    job.gpus as u64 * on_host * checkpoint,
                ));
                device.push(Item::held(
                    "block input and output in flight",
                    2 * checkpoint,
                ));
            }
            let on_device = s.layers + 1 - on_host;
            if on_device > 0 {
                device.push(Item::held(
                    if on_host > 0 {
                        "block-input checkpoints kept on the device"
                    } else {
                        "block-input checkpoints"
                    },
                    on_device * checkpoint,
                ));
            }
            if job.gpus > 1 {
                // A block's gradients summed across the devices, beside the
                // device's own, on the device that sends them to the host.
                device.push(Item::held(
                    "a block's gradients summed across the GPUs",
                    width * s.block_params,
                ));
            }
            if !job.fused {
                // The block being handed on, and those the worker is still
                // taking, hold their gradients on the device.
                device.push(Item::held(
                    "block gradients on their way to the host",
                    width * (job.gradient_blocks_in_flight as u64 + 1) * block_gradients,
                ));
            }
            let kept = (job.kept_graphs.count() as u64).min(s.layers);
            if kept > 0 {
                device.push(Item::held(
                    "graphs kept from the forward (not recomputed)",
                    kept * kept_graph_bytes(job),
                ));
            }
            let kept_attention = (job.kept_attention as u64).min(s.layers - kept);
            if kept_attention > 0 {
                device.push(Item::held(
                    "attention outputs kept for the recompute",
                    kept_attention * kept_attention_bytes(job),
                ));
            }
            device.push(Item::phase(
                match job.mlp_tile {
                    Some(_) => "one block's activations (recompute + backward; MLP in tiles)",
                    None => "one block's activations (recompute + backward)",
                },
                block_backward,
            ));
            device.push(Item::phase(
                "LM head + loss chunk",
                loss_chunk + head_gradient,
            ));
        }
        if job.gpu {
            device.push(Item::held(CONTEXT, runtime_device));
        }
        if !job.resident {
            // Building the store holds one group's values twice (the stem is the largest).
            host.push(Item::held(
                "while building: one group's values",
                F32 * s.stem_params.max(s.block_params),
            ));
        }
        // Libraries, the token stream, the CUDA driver's host side.
        host.push(Item::held(
            "runtime (libraries, corpus, driver)",
            host_runtime(job.gpu),
        ));
        // A job that fills the host to the last page thrashes the page cache
        // (a 7.4B run at 16 B/param on 125 GiB did not finish a step).
        let used: u64 = host.iter().map(|i| i.bytes).sum();
        host.push(Item::held(
            "headroom for the OS and page cache (8%, >= 1 GiB)",
            (used * 8 / 100).max(MIN_HOST_HEADROOM),
        ));
        Self {
            host,
            device,
            params,
            devices: job.gpus as u64,
        }
    }

    pub fn host_total(&self) -> u64 {
        self.host.iter().map(|i| i.bytes).sum()
    }

    /// Device bytes at the peak: everything held, plus the largest phase.
    pub fn device_total(&self) -> u64 {
        let held: u64 = self
            .device
            .iter()
            .filter(|i| !i.phase)
            .map(|i| i.bytes)
            .sum();
        let phase = self
            .device
            .iter()
            .filter(|i| i.phase)
            .map(|i| i.bytes)
            .max();
        held + phase.unwrap_or(0)
    }

    /// The device peak on this machine: on a GPU, never below what cubecl's
    /// pools reserve once each page class is in use.
    pub fn device_peak(&self, machine: &Machine) -> u64 {
        match machine.device_bytes {
            Some(gpu) => self.device_total().max(self.device_floor(gpu)),
            None => self.device_total(),
        }
    }

    /// The pools' floor plus the CUDA context.
    fn device_floor(&self, gpu: u64) -> u64 {
        let context: u64 = self
            .device
            .iter()
            .filter(|i| i.what == CONTEXT)
            .map(|i| i.bytes)
            .sum();
        pool_floor(gpu) + context
    }

    /// Host bytes of the store alone (weights, Adam state, gradient buffer).
    pub fn store_bytes(&self) -> u64 {
        self.host
            .iter()
            .filter(|i| {
                i.what.starts_with("parameters (")
                    || i.what.starts_with("Adam")
                    || i.what.starts_with("gradient buffer")
            })
            .map(|i| i.bytes)
            .sum()
    }

    /// The plan as a table, with the machine's figures.
    pub fn table(&self, machine: &Machine) -> String {
        let mut out = String::new();
        let mut section = |title: &str, items: &[Item], total: u64, have: Option<(u64, &str)>| {
            let _ = writeln!(out, "{title}");
            for item in items {
                let _ = writeln!(
                    out,
                    "  {:<50} {:>10.2} GiB",
                    item.what,
                    item.bytes as f64 / GIB
                );
            }
            let _ = writeln!(out, "  {:<50} {:>10.2} GiB", "total", total as f64 / GIB);
            if let Some((bytes, source)) = have {
                let _ = writeln!(
                    out,
                    "  {:<50} {:>10.2} GiB ({source})",
                    "available",
                    bytes as f64 / GIB
                );
            }
        };
        section(
            "host",
            &self.host,
            self.host_total(),
            Some((machine.host_bytes, &machine.host_source)),
        );
        let mut device = self.device.clone();
        if let Some(gpu) = machine.device_bytes {
            device.push(Item::held(
                "(floor: context + cubecl's pages, 1/12 of the GPU)",
                self.device_floor(gpu),
            ));
        }
        section(
            match (machine.device_bytes.is_some(), self.devices) {
                (true, 1) => "device (GPU; of the two phases the larger counts)",
                (true, _) => "device (each GPU; of the two phases the larger counts)",
                (false, 1) => "device (the host: CPU backend)",
                (false, _) => "device (each logical device, in the host: CPU backend)",
            },
            &device,
            self.device_peak(machine),
            machine
                .device_bytes
                .map(|b| (b, machine.device_source.as_str())),
        );
        let _ = writeln!(
            out,
            "{:.1} host bytes/param",
            self.host_total() as f64 / self.params.max(1) as f64
        );
        out
    }

    /// Host and device bytes needed on this machine (on CPU backends every
    /// logical device's share comes out of host memory; a GPU holds its own).
    pub(super) fn needs(&self, machine: &Machine) -> (u64, Option<u64>) {
        match machine.device_bytes {
            Some(_) => (self.host_total(), Some(self.device_peak(machine))),
            None => (self.host_total() + self.devices * self.device_total(), None),
        }
    }
}

/// Host bytes of the libraries, the token stream and the CUDA driver's host
/// side.
fn host_runtime(gpu: bool) -> u64 {
    if gpu {
        (1.5 * GIB) as u64
    } else {
        (0.25 * GIB) as u64
    }
}

/// The least headroom the plan leaves the OS and its page cache.
const MIN_HOST_HEADROOM: u64 = 1 << 30;

/// Host bytes any run needs before its model: the runtime and the OS's
/// least headroom.
pub(super) fn host_floor(gpu: bool) -> u64 {
    host_runtime(gpu) + MIN_HOST_HEADROOM
}

/// What cubecl's pools hold on a GPU with `gpu` bytes as soon as every page
/// class has been used once.
fn pool_floor(gpu: u64) -> u64 {
    (gpu as f64 * POOL_FLOOR_FRACTION) as u64
}

impl Plan {
    /// Whether the device part fits `machine` (always, on CPU backends).
    pub(super) fn fits_device(&self, machine: &Machine) -> bool {
        match (self.needs(machine).1, machine.device_bytes) {
            (Some(need), Some(have)) => need <= have,
            _ => true,
        }
    }

    /// Whether the job fits: [`Plan::check`]'s answer without working out
    /// what would fit instead (for searches over many candidates).
    pub(crate) fn check_quiet(&self, machine: &Machine) -> bool {
        self.needs(machine).0 <= machine.host_bytes && self.fits_device(machine)
    }
}
