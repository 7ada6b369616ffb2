//! The PCIe budget of an engine job: the bytes each GPU's link carries in a
//! step, and the step time they set at least. Each GPU has a link of its
//! own (48–53 GB/s each way measured per H100 on hosts of two and four), so
//! the budget is per GPU; the host memory the links read is summed over
//! the GPUs of the host.

use std::fmt::Write as _;

use models::ModelConfig;

use crate::plan::{shape, Job};

/// What one GPU's link carries each way per step, in the engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Links {
    /// Host → GPU: every block's weights for the forward and again for the
    /// recompute, the stem for the head, block inputs kept in host memory.
    pub to_device: u64,
    /// GPU → host: the blocks' and the stem's gradients this GPU sends,
    /// block inputs kept in host memory.
    pub to_host: u64,
    /// Tokens this GPU trains on per step.
    pub tokens: u64,
    /// GPUs of the job on this host, whose links all read host memory.
    pub gpus: u64,
}

/// The rate of one H100's link each way, in bytes a second: 48–53 GB/s
/// were measured per GPU with two and four GPUs copying at once.
pub const LINK_BYTES_PER_S: f64 = 50e9;

impl Links {
    /// The links' budget of an engine job on GPUs (`None` for resident
    /// jobs and CPU backends, which have no link).
    pub fn of(job: &Job) -> Option<Self> {
        if job.resident || !job.gpu {
            return None;
        }
        let s = shape(&job.config);
        let width = job.compute.bytes() as u64;
        // The compact layout uploads the f32 weights and casts them on the GPU.
        let upload = if job.compact() { 4 } else { width };
        let recomputed = s.layers - (job.kept_graphs.count() as u64).min(s.layers);
        let tokens = (job.batch * job.seq_len) as u64;
        // The recomputed blocks' inputs held in host memory come back once each.
        let on_host = if job.host_block_inputs(s.layers) > 0 {
            recomputed.saturating_sub(job.device_block_inputs as u64)
        } else {
            0
        };
        let inputs = width * tokens * s.d * on_host;
        // A LoRA base crosses as held (bf16, int8 or NF4) and only the
        // adapters' gradients come back; its share per block is counted
        // over the whole base (the stem's frozen part included: an
        // overestimate by the embeddings' share).
        let layers = s.layers.max(1);
        let (block_upload, block_gradients) = match job.frozen_host_bytes {
            Some(frozen) => {
                let trained = job.trained_params.unwrap_or(0);
                (
                    (frozen + upload * trained) / layers,
                    width * trained / layers,
                )
            }
            None => (upload * s.block_params, width * s.block_params),
        };
        let per_pass_to_device =
            block_upload * (s.layers + recomputed) + 4 * s.stem_params + inputs;
        // Lanes of one process take turns at sending the blocks' sums, in
        // the compute precision (the head's go from the first, in f32); a
        // process of several sends them all. A Llama's embedding is looked
        // up on the host: its gradient is formed there from `dy`, one row a
        // token (at most), and the table's own never crosses.
        let lanes = job.gpus.max(1) as u64;
        let stem = match job.config {
            ModelConfig::Llama(_) => 4 * (s.stem_params - s.vocab * s.d) + width * tokens * s.d,
            ModelConfig::Gpt2(_) => 4 * s.stem_params,
        };
        let per_pass_to_host = block_gradients * s.layers / lanes + stem + inputs;
        // Fused mode with exact clipping or the guard runs each step twice.
        let passes = job.accum as u64 * if job.fused { 2 } else { 1 };
        Some(Self {
            to_device: passes * per_pass_to_device,
            to_host: passes * per_pass_to_host,
            tokens: job.accum as u64 * tokens,
            gpus: lanes,
        })
    }

    /// The step time the links set at least: the busier direction at
    /// [`LINK_BYTES_PER_S`] (the two directions copy at once).
    pub fn seconds(&self) -> f64 {
        self.to_device.max(self.to_host) as f64 / LINK_BYTES_PER_S
    }

    /// The budget as `--plan` prints it.
    pub fn describe(&self) -> String {
        const GIB: f64 = (1u64 << 30) as f64;
        let mut out = String::new();
        let seconds = self.seconds();
        let _ = writeln!(
            out,
            "PCIe, each GPU's link a step: {:.2} GiB to the GPU, {:.2} GiB to the host; \
             at {:.0} GB/s each way, at least {:.3} s a step (at most {:.0} tok/s a GPU)",
            self.to_device as f64 / GIB,
            self.to_host as f64 / GIB,
            LINK_BYTES_PER_S / 1e9,
            seconds,
            self.tokens as f64 / seconds.max(1e-9),
        );
        if self.gpus > 1 {
            let _ = writeln!(
                out,
                "host memory read by the {} links: {:.2} GiB a step",
                self.gpus,
                (self.gpus * self.to_device) as f64 / GIB,
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{
        BlockInputs, HostLayout, KeptGraphs, OptimState, ParamCache, Recompute,
        GRADIENT_BLOCKS_IN_FLIGHT,
    };
    use burn_offload::Compute;

    fn bytes(compute: Compute) -> u64 {
        compute.bytes() as u64
    }

    fn job(gpus: usize, compute: Compute) -> Job {
        Job {
            config: ModelConfig::from_arg("llama-1b").unwrap(),
            batch: 4,
            seq_len: 1024,
            accum: 1,
            gpus,
            fused: false,
            resident: false,
            host_params: false,
            compute,
            loss_chunk_tokens: 4096,
            gpu: true,
            cudnn: true,
            block_inputs: BlockInputs::Device,
            device_block_inputs: 0,
            kept_graphs: KeptGraphs::Count(0),
            kept_attention: 0,
            host_layout: HostLayout::Full,
            optim_state: OptimState::Fp32,
            gradient_blocks_in_flight: GRADIENT_BLOCKS_IN_FLIGHT,
            mlp_tile: None,
            param_cache: ParamCache::Auto,
            block_recompute: Recompute::Auto,
            trained_params: None,
            frozen_host_bytes: None,
            smaller_bases: Vec::new(),
            frozen_stem: false,
            gpu_budget: false,
        }
    }

    #[test]
    fn each_gpu_carries_every_block_twice_and_its_share_of_the_gradients() {
        let one = Links::of(&job(1, Compute::Bf16)).unwrap();
        let s = shape(&job(1, Compute::Bf16).config);
        let blocks = s.block_params * s.layers;
        assert_eq!(
            one.to_device,
            2 * bytes(Compute::Bf16) * blocks + 4 * s.stem_params
        );
        // The head's gradients in f32, the embedding's output gradient.
        let stem_to_host = 4 * (s.stem_params - s.vocab * s.d) + 2 * 4 * 1024 * s.d;
        assert_eq!(one.to_host, 2 * blocks + stem_to_host);
        let two = Links::of(&job(2, Compute::Bf16)).unwrap();
        assert_eq!(two.to_device, one.to_device);
        assert_eq!(two.to_host, blocks + stem_to_host);
        assert!(two.describe().contains("host memory read by the 2 links"));
        // Kept graphs skip their recompute's copies; fp32 doubles the weights.
        let kept = Links::of(&Job {
            kept_graphs: KeptGraphs::Count(s.layers as usize),
            ..job(1, Compute::Fp32)
        })
        .unwrap();
        assert_eq!(kept.to_device, 4 * blocks + 4 * s.stem_params);
        assert!(Links::of(&Job {
            resident: true,
            ..job(1, Compute::Fp32)
        })
        .is_none());
    }
}
