//! What is trained, and what the machine has.

use burn_offload::Compute;
use models::ModelConfig;

use super::knobs::{BlockInputs, HostLayout, KeptGraphs, OptimState, ParamCache, Recompute};

/// What the job is.
#[derive(Debug, Clone)]
pub struct Job {
    pub config: ModelConfig,
    pub batch: usize,
    pub seq_len: usize,
    /// Micro-batches per step on each device (activations are those of one).
    pub accum: usize,
    /// Devices trained on, data parallel: each holds the device items below
    /// (the plan's device figures are per device), the host the store once
    /// and each device's block inputs.
    pub gpus: usize,
    pub fused: bool,
    pub resident: bool,
    /// With `resident`: the model on `Offload<B>` with the host optimizer
    /// (weights and Adam state in host memory, gradients on the device until
    /// the step, weights paged in through a cache).
    pub host_params: bool,
    /// Device compute precision: sets the bytes of weights on the device,
    /// activations and checkpoints (the loss stays f32).
    pub compute: Compute,
    pub loss_chunk_tokens: usize,
    /// Whether the device is a GPU (its context and pools cost memory).
    pub gpu: bool,
    /// Whether cuDNN's fused attention runs attention where it takes the
    /// heads (a CUDA build, the library found, `--attention auto`): its
    /// backward needs far less scratch than the CubeCL kernels'.
    pub cudnn: bool,
    /// Where the engine keeps the block-input checkpoints on a GPU.
    pub block_inputs: BlockInputs,
    /// With the block inputs in host memory: how many recomputed blocks
    /// (the last ones) keep theirs on the device anyway, where the host
    /// cannot hold every one (`EngineConfig::device_checkpoints`); decided
    /// by [`Job::place_device_block_inputs`].
    pub device_block_inputs: usize,
    /// How many of the last blocks keep their forward graph (no recompute).
    pub kept_graphs: KeptGraphs,
    /// How many recomputed blocks (the last ones) keep their attention
    /// outputs from the forward (`EngineConfig::kept_attention`); decided
    /// by [`Job::place_kept_attention`].
    pub kept_attention: usize,
    /// How the host holds the gradients and the weights for upload.
    pub host_layout: HostLayout,
    /// The optimizer's moments: fp32 or 8-bit.
    pub optim_state: OptimState,
    /// Blocks whose gradients may wait on the device for the host worker
    /// (`EngineConfig::gradient_blocks_in_flight`).
    pub gradient_blocks_in_flight: usize,
    /// The blocks' MLP over tiles of this many tokens
    /// (`burn_offload::ops::mlp`), where the plan needs it.
    pub mlp_tile: Option<usize>,
    /// With `host_params`: the device copies of parameters kept cached.
    pub param_cache: ParamCache,
    /// With `host_params`: whether each block runs as a checkpoint (decided
    /// by [`Job::place_block_recompute`] where `Auto`).
    pub block_recompute: Recompute,
    /// With LoRA (`--lora-rank`): the parameters that train (the adapters,
    /// and the embeddings and head with `--train-embeddings`); the rest is
    /// frozen, with no gradient and no optimizer state. `None`: every
    /// parameter trains.
    pub trained_params: Option<u64>,
    /// With LoRA on the offload engine: the host bytes of the frozen base
    /// as `--base-dtype` holds it (no gradient, no optimizer state).
    pub frozen_host_bytes: Option<u64>,
    /// With LoRA: the base formats (`--base-dtype` names) that hold it in
    /// fewer host bytes than `frozen_host_bytes`, and their bytes.
    pub smaller_bases: Vec<(&'static str, u64)>,
    /// With LoRA: the embeddings and head are frozen (no
    /// `--train-embeddings`), so the head has no weight gradient and the
    /// device holds them in the compute precision.
    pub frozen_stem: bool,
    /// The GPU is held to `--gpu-mem-gib`: cubecl's pools stop 2 GiB below
    /// it (`cuda_backend::limit_memory_pages`), which the plan counts
    /// outside them (1 GiB, as measured, without a budget).
    pub gpu_budget: bool,
}

impl Job {
    /// Whether the type parameter runs its blocks as checkpoints (`Auto`
    /// counted as on until placed: the plan the GPU surely fits).
    pub fn recomputes_blocks(&self) -> bool {
        self.resident && self.host_params && self.block_recompute != Recompute::Off
    }

    /// How many block-input checkpoints (of `layers + 1`: every block's
    /// input and the last one's output) the engine keeps in host memory.
    pub fn host_block_inputs(&self, layers: u64) -> u64 {
        if self.gpu && !self.resident && self.block_inputs == BlockInputs::Host {
            (layers + 1).saturating_sub(self.device_block_inputs as u64)
        } else {
            0
        }
    }

    /// The engine's [`EngineConfig::device_checkpoints`] for this job: every
    /// block's on the device unless they go to host memory, where the
    /// plan's count stays on the device.
    ///
    /// [`EngineConfig::device_checkpoints`]: burn_offload::EngineConfig::device_checkpoints
    pub fn device_checkpoints(&self) -> usize {
        match self.block_inputs {
            BlockInputs::Host => self.device_block_inputs,
            BlockInputs::Device | BlockInputs::Auto => usize::MAX,
        }
    }

    /// Whether the compact host layout can apply to this job: the engine,
    /// a compute precision below fp32.
    pub fn compact_applies(&self) -> bool {
        !self.resident && self.compute != Compute::Fp32
    }

    /// Whether the job runs with the compact host layout (once placed).
    pub fn compact(&self) -> bool {
        self.host_layout == HostLayout::Compact
    }

    /// Whether the blocks' gradient buffer is in the compute precision: the
    /// compact layout with a buffer and one micro-batch.
    pub fn compact_gradients(&self) -> bool {
        self.compact() && !self.fused && self.accum == 1
    }

    /// The store's mode in words, with its host bytes per parameter and
    /// whether clipping and the guard need one backward or two.
    pub fn store_mode(&self) -> String {
        if self.resident {
            return "resident (plain burn)".into();
        }
        let layout = if self.compact() { "compact" } else { "full" };
        let mode = if self.fused { "fused" } else { "buffered" };
        let exact = if self.fused {
            "clipping or the guard run the backward twice"
        } else {
            "exact clipping and guard with one backward"
        };
        format!(
            "{mode}, host layout {layout}, {} Adam state: {} B/param in the store ({exact})",
            self.optim_state,
            self.store_bytes_per_param()
        )
    }

    /// Host bytes per parameter of the engine's store in this job's mode.
    pub fn store_bytes_per_param(&self) -> u64 {
        let copy = if self.compute != Compute::Fp32 && !self.compact() {
            2
        } else {
            0
        };
        let gradients = match (self.fused, self.compact_gradients()) {
            (true, _) => 0,
            (false, true) => 2,
            (false, false) => 4,
        };
        let moments = match self.optim_state {
            OptimState::Fp32 => 8,
            OptimState::EightBit => 2,
        };
        4 + moments + copy + gradients
    }
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
