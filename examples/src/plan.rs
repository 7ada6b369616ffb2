//! The memory planner: the host and device bytes a training job will need,
//! predicted from the model config and batch shape before anything is
//! allocated, checked against what the machine has.
//!
//! Host figures are exact for the store (fp32 weights, Adam m and v, and the
//! gradient buffer unless fused) and close for the engine's own buffers.
//! Device figures are estimates: one Llama/GPT-2 block's activations under
//! autodiff are counted tensor by tensor (DESIGN.md §3) with a margin for the
//! backward's temporaries, plus a fixed allowance for the CUDA context and
//! the allocator's pools.

use std::fmt::Write as _;

use models::ModelConfig;

const GIB: f64 = (1u64 << 30) as f64;
const F32: u64 = 4;

/// What the job is.
#[derive(Debug, Clone)]
pub struct Job {
    pub config: ModelConfig,
    pub batch: usize,
    pub seq_len: usize,
    /// Micro-batches per step (activations are those of one).
    pub accum: usize,
    pub fused: bool,
    pub resident: bool,
    pub loss_chunk_tokens: usize,
    /// Whether the device is a GPU (its context and pools cost memory).
    pub gpu: bool,
}

/// What the machine has, and where each figure came from.
#[derive(Debug, Clone)]
pub struct Machine {
    pub host_bytes: u64,
    pub host_source: String,
    /// `None`: the device is the host (CPU backends).
    pub device_bytes: Option<u64>,
    pub device_source: String,
}

/// One line of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub what: &'static str,
    pub bytes: u64,
}

/// Predicted memory of a job.
#[derive(Debug, Clone)]
pub struct Plan {
    pub host: Vec<Item>,
    pub device: Vec<Item>,
    /// Parameters, for bytes/param.
    pub params: u64,
}

/// Shape facts the estimate needs, for either architecture.
struct Shape {
    vocab: u64,
    d: u64,
    layers: u64,
    heads: u64,
    block_params: u64,
    stem_params: u64,
    largest_tensor: u64,
    /// f32 values a block keeps for backward, per token (excluding attention scores).
    saved_per_token: u64,
}

fn shape(config: &ModelConfig) -> Shape {
    match config {
        ModelConfig::Llama(c) => {
            let (d, kv) = (c.d_model as u64, (c.n_kv_head * c.head_dim()) as u64);
            let ff = c.d_ff as u64;
            let block_params = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * ff;
            let vocab = c.vocab_size as u64;
            Shape {
                vocab,
                d,
                layers: c.n_layer as u64,
                heads: c.n_head as u64,
                block_params,
                stem_params: 2 * vocab * d + d,
                largest_tensor: (vocab * d).max(ff * d),
                // norms 2×3d, q/k/v d+2kv, RoPE 3(d+kv), GQA repeat 2d,
                // attention out, o-proj and residuals 4d, SwiGLU 5ff.
                saved_per_token: 6 * d + (d + 2 * kv) + 3 * (d + kv) + 2 * d + 4 * d + 5 * ff,
            }
        }
        ModelConfig::Gpt2(c) => {
            let d = c.d_model as u64;
            let vocab = c.vocab_size as u64;
            Shape {
                vocab,
                d,
                layers: c.n_layer as u64,
                heads: c.n_head as u64,
                block_params: 12 * d * d + 13 * d,
                stem_params: vocab * d + c.n_ctx as u64 * d + 2 * d,
                largest_tensor: vocab * d,
                // LayerNorms 2×3d, qkv 3d, attention out, proj and residuals 4d, GELU MLP 3×4d.
                saved_per_token: 6 * d + 3 * d + 4 * d + 12 * d,
            }
        }
    }
}

impl Plan {
    pub fn new(job: &Job) -> Self {
        let s = shape(&job.config);
        let params = job.config.num_params() as u64;
        let tokens = (job.batch * job.seq_len) as u64;
        let (b, t) = (job.batch as u64, job.seq_len as u64);
        // Attention probabilities and their softmax/backward temporaries: the
        // B·H·T² tensors dominate at long sequences.
        let scores = 4 * b * s.heads * t * t;
        let block_forward = F32 * (tokens * s.saved_per_token + scores);
        // The backward holds the saved values plus about half as much again in
        // gradients of the same shapes.
        let block_backward = block_forward * 3 / 2;
        let chunk = (job.loss_chunk_tokens as u64).clamp(1, tokens);
        // Logits, log-softmax (and its max/exp/sum), their gradient.
        let loss_chunk = F32 * 5 * chunk * s.vocab;
        let runtime_device = if job.gpu { (1.0 * GIB) as u64 } else { 0 };

        let mut host = vec![
            Item {
                what: "parameters (fp32 master weights)",
                bytes: F32 * params,
            },
            Item {
                what: "Adam m and v (fp32)",
                bytes: 2 * F32 * params,
            },
        ];
        let mut device = Vec::new();
        if job.resident {
            device.push(Item {
                what: "parameters, gradients, Adam m and v",
                bytes: 4 * F32 * params,
            });
            device.push(Item {
                what: "activations of every block (one graph)",
                bytes: s.layers * block_forward,
            });
            device.push(Item {
                what: "logits and loss (whole batch)",
                bytes: F32 * 5 * tokens * s.vocab,
            });
            // Resident training keeps its state on the device; the host holds
            // only the initial copy burn makes while building the model.
            host = vec![Item {
                what: "parameters while building (fp32)",
                bytes: F32 * params,
            }];
        } else {
            if !job.fused {
                host.push(Item {
                    what: "gradient buffer (fp32)",
                    bytes: F32 * params,
                });
            }
            host.push(Item {
                what: "gradients in flight (two blocks and the stem)",
                bytes: F32 * (2 * s.block_params + s.stem_params),
            });
            host.push(Item {
                what: "download staging (largest tensor)",
                bytes: F32 * s.largest_tensor,
            });
            device.push(Item {
                what: "weights: stem + two blocks",
                bytes: F32 * (s.stem_params + 2 * s.block_params),
            });
            let checkpoints = F32 * (s.layers + 1) * tokens * s.d;
            if job.gpu {
                // The engine keeps them in host memory on a GPU (flat in depth).
                host.push(Item {
                    what: "block-input checkpoints",
                    bytes: checkpoints,
                });
                device.push(Item {
                    what: "block input and output in flight",
                    bytes: 2 * F32 * tokens * s.d,
                });
            } else {
                device.push(Item {
                    what: "block-input checkpoints",
                    bytes: checkpoints,
                });
            }
            device.push(Item {
                what: "one block's activations (recompute + backward)",
                bytes: block_backward,
            });
            device.push(Item {
                what: "LM head + loss chunk",
                bytes: loss_chunk + F32 * s.vocab * s.d,
            });
        }
        if job.gpu {
            device.push(Item {
                what: "CUDA context and allocator pools",
                bytes: runtime_device,
            });
        }
        if !job.resident {
            // Building the store holds one group's values twice (the stem is the largest).
            host.push(Item {
                what: "while building: one group's values",
                bytes: F32 * s.stem_params.max(s.block_params),
            });
        }
        // Libraries, the token stream, the CUDA driver's host side.
        host.push(Item {
            what: "runtime (libraries, corpus, driver)",
            bytes: if job.gpu {
                (1.5 * GIB) as u64
            } else {
                (0.25 * GIB) as u64
            },
        });
        // A job that fills the host to the last page thrashes the page cache
        // (a 7.4B run at 16 B/param on 125 GiB did not finish a step).
        let used: u64 = host.iter().map(|i| i.bytes).sum();
        host.push(Item {
            what: "headroom for the OS and page cache (8%, >= 1 GiB)",
            bytes: (used * 8 / 100).max(GIB as u64),
        });
        Self {
            host,
            device,
            params,
        }
    }

    pub fn host_total(&self) -> u64 {
        self.host.iter().map(|i| i.bytes).sum()
    }

    pub fn device_total(&self) -> u64 {
        self.device.iter().map(|i| i.bytes).sum()
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
        section(
            if machine.device_bytes.is_some() {
                "device (GPU)"
            } else {
                "device (the host: CPU backend)"
            },
            &self.device,
            self.device_total(),
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

    /// Host and device bytes needed on this machine (on CPU backends the
    /// device's share comes out of host memory).
    fn needs(&self, machine: &Machine) -> (u64, Option<u64>) {
        match machine.device_bytes {
            Some(_) => (self.host_total(), Some(self.device_total())),
            None => (self.host_total() + self.device_total(), None),
        }
    }

    /// `Ok` when the job fits; otherwise what is needed, what is available,
    /// and what would fit.
    pub fn check(&self, job: &Job, machine: &Machine) -> Result<(), String> {
        let (host, device) = self.needs(machine);
        let mut problems = Vec::new();
        if host > machine.host_bytes {
            let store = if job.resident {
                String::new()
            } else if job.fused {
                " (12 B/param: weights, Adam m and v; plus buffers)".to_string()
            } else {
                " (16 B/param: weights, Adam m and v, gradients; plus buffers)".to_string()
            };
            // The lent GPU hosts grow RAM on demand: MemAvailable at start can understate.
            let grows = if machine.host_source == "MemAvailable" {
                "; pass --host-mem-gib if this machine's memory grows on demand"
            } else {
                ""
            };
            problems.push(format!(
                "not enough host memory: needs {:.2} GiB{store}, {:.2} GiB available ({}){grows}",
                host as f64 / GIB,
                machine.host_bytes as f64 / GIB,
                machine.host_source
            ));
        }
        if let (Some(need), Some(have)) = (device, machine.device_bytes) {
            if need > have {
                problems.push(format!(
                    "not enough GPU memory: needs {:.2} GiB, {:.2} GiB available ({})",
                    need as f64 / GIB,
                    have as f64 / GIB,
                    machine.device_source
                ));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{}; {}",
            problems.join("; "),
            suggestion(job, machine)
        ))
    }
}

/// What would fit: fused mode, the engine instead of resident, a smaller batch.
fn suggestion(job: &Job, machine: &Machine) -> String {
    let fits = |j: &Job| Plan::new(j).check_quiet(machine);
    let mut tries = Vec::new();
    if job.resident {
        tries.push((
            Job {
                resident: false,
                ..job.clone()
            },
            "drop --resident (stream from host memory)".to_string(),
        ));
    }
    if !job.fused && !job.resident {
        tries.push((
            Job {
                fused: true,
                accum: 1,
                ..job.clone()
            },
            "--fused (12 B/param on the host)".to_string(),
        ));
    }
    for (candidate, what) in &tries {
        if fits(candidate) {
            return format!("try {what}");
        }
    }
    let mut base = job.clone();
    if !fits(&base) && !base.resident && !base.fused {
        base.fused = true;
    }
    for batch in (1..job.batch).rev() {
        let smaller = Job {
            batch,
            ..base.clone()
        };
        if fits(&smaller) {
            let fused = if base.fused && !job.fused {
                " --fused"
            } else {
                ""
            };
            return format!(
                "try --batch {batch}{fused} (with --accum to keep the tokens per step)"
            );
        }
    }
    if job.fused || job.resident {
        "no batch size fits: try a smaller model or a larger machine".into()
    } else {
        "no batch size fits: try --fused (12 B/param on the host) with a smaller model, or a larger machine".into()
    }
}

impl Plan {
    fn check_quiet(&self, machine: &Machine) -> bool {
        let (host, device) = self.needs(machine);
        host <= machine.host_bytes
            && match (device, machine.device_bytes) {
                (Some(need), Some(have)) => need <= have,
                _ => true,
            }
    }
}
