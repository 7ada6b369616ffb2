//! The engine's settings, their one check, and its errors.

use burn::tensor::backend::Backend;

use crate::host::optim::{OptimizerConfig, OptimizerError};
use crate::host::processes::ProcessError;
use crate::precision::{Compute, PrecisionError};
use crate::store::StoreError;

/// How the engine trains.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// The optimizer run over the host slabs.
    pub optimizer: OptimizerConfig,
    /// Clip the global gradient norm to this value (`None`: no clipping).
    pub grad_clip: Option<f64>,
    /// Apply each block's update as soon as its gradient arrives (no gradient buffer).
    pub fused: bool,
    /// Tokens per chunk of the LM head and loss.
    pub loss_chunk_tokens: usize,
    /// Skip a step whose loss or gradients are not finite, leaving parameters
    /// and optimizer state untouched. In fused mode this needs the gradient
    /// norm before the first update, so the backward runs twice (as with clipping).
    pub skip_non_finite: bool,
    /// Overlap copies and CPU work with compute (the pipeline). `false` is the
    /// serialised baseline of the bench: every bind first waits for the device
    /// to go idle and then for its copies, and the CPU handles a block's
    /// gradients only once the device is idle.
    pub overlap: bool,
    /// Recomputed blocks, counted back from the last one recomputed, whose
    /// input checkpoint stays on the device until its backward; on GPU
    /// backends the others' go to host memory, so device memory stays flat
    /// in depth (each costs one copy each way). 0 sends every one to the
    /// host; more than there are keeps every one on the device. A plan
    /// whose host memory cannot hold them all keeps some here instead.
    pub device_checkpoints: usize,
    /// The precision the device computes in; the host state stays f32.
    pub compute: Compute,
    /// With a compute precision below f32: upload the f32 weights and cast
    /// them on the device, instead of keeping a copy in the compute
    /// precision in host memory (2 host bytes/param fewer, twice the bytes
    /// uploaded). The same values reach the kernels either way.
    pub cast_on_device: bool,
    /// With a compute precision below f32 and a gradient buffer: the blocks'
    /// gradients are kept in host memory as they arrive, in the compute
    /// precision (2 host bytes/param fewer). Exact, since nothing is added
    /// to them: a step takes one micro-batch.
    pub compute_precision_gradients: bool,
    /// Keep the optimizer's moments 8-bit blockwise (bitsandbytes' 8-bit
    /// Adam scheme: about 2 host bytes/param for both instead of 8),
    /// dequantised and quantised again inside the update loop.
    pub eight_bit_moments: bool,
    /// Blocks, counted back from the last, whose forward runs under
    /// `Autodiff` and keeps its graph on the device until the backward, which
    /// then seeds it directly instead of recomputing the block from its
    /// checkpoint. Each costs one block's saved activations of device memory
    /// for the whole step (and keeps its weights bound); 0 recomputes every
    /// block. A GPU with memory to spare trades it for the recompute.
    pub kept_graphs: usize,
    /// Recomputed blocks, counted back from the last one recomputed, whose
    /// attention output (and its rows' log-sum-exp) is kept from the forward
    /// on the device until the block's backward, so their recompute skips
    /// attention's forward: past ~100k tokens a sequence that forward is
    /// most of a block's. Each costs the output's `[tokens, query width]`
    /// values in the compute precision and an f32 per token and head; 0
    /// keeps none, more than there are keeps every one.
    pub kept_attention: usize,
    /// On CUDA, have threads that wait for the device sleep instead of
    /// spinning (the primary context's scheduling flag), leaving the cores to
    /// the host work that overlaps the device. `false` keeps the driver's
    /// default (a benchmark baseline).
    pub blocking_sync: bool,
    /// In overlap mode, have the host optimizer wait while one of the
    /// forward's weight copies is in flight, so its pass over host memory
    /// does not slow the copy (see `host::throttle`). `false` lets them share
    /// host memory bandwidth.
    pub hold_updates_for_copies: bool,
    /// In overlap mode, the most blocks whose gradients the host worker may
    /// still be taking while the backward goes on (0: no bound). Each holds
    /// its gradients on the device until the worker has copied them, so when
    /// the worker falls behind (short sequences, where a block's backward
    /// takes less time than its gradients' trip to the host) the bound keeps
    /// device memory flat instead of growing with depth.
    pub gradient_blocks_in_flight: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            optimizer: OptimizerConfig::AdamW(Default::default()),
            grad_clip: None,
            fused: false,
            loss_chunk_tokens: 4096,
            skip_non_finite: true,
            overlap: true,
            device_checkpoints: 0,
            compute: Compute::Fp32,
            cast_on_device: false,
            compute_precision_gradients: false,
            eight_bit_moments: false,
            kept_graphs: 0,
            kept_attention: 0,
            blocking_sync: true,
            hold_updates_for_copies: true,
            gradient_blocks_in_flight: 4,
        }
    }
}

impl EngineConfig {
    /// Checks the settings on their own and against `device` (every way of
    /// building an engine runs this one check).
    pub fn validate<B: Backend>(&self, device: &B::Device) -> Result<(), EngineError> {
        self.optimizer.validate()?;
        self.compute
            .check::<B>(device)
            .map_err(ConfigError::Precision)?;
        if self.loss_chunk_tokens == 0 {
            return Err(ConfigError::LossChunk.into());
        }
        if self.compute == Compute::Fp32 {
            if self.cast_on_device {
                return Err(ConfigError::NeedsLowPrecision("cast_on_device").into());
            }
            if self.compute_precision_gradients {
                return Err(ConfigError::NeedsLowPrecision("compute_precision_gradients").into());
            }
        }
        if self.compute_precision_gradients && self.fused {
            return Err(ConfigError::FusedGradients.into());
        }
        if let Some(clip) = self.grad_clip {
            if !(clip.is_finite() && clip > 0.0) {
                return Err(ConfigError::GradClip(clip).into());
            }
        }
        Ok(())
    }
}

/// Why the engine refused to build or to step.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model and the store disagree.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An optimizer setting or learning rate out of range.
    #[error(transparent)]
    Optimizer(#[from] OptimizerError),
    /// A setting of the engine that cannot work (its message holds the
    /// cause, which is therefore not also its `source`).
    #[error("invalid engine config: {0}")]
    Config(ConfigError),
    /// Micro-batches the engine cannot train on.
    #[error("bad batch: {0}")]
    Batch(BatchError),
    /// The run's processes could not exchange what they must, or disagree.
    #[error(transparent)]
    Processes(#[from] ProcessError),
    /// A block that changed the shape of its input.
    #[error("block {block} returned hidden states of shape {got:?} for an input of shape {want:?}; blocks must preserve [batch, seq, d_model]")]
    Checkpoint {
        /// The block.
        block: usize,
        /// Its output's shape.
        got: Vec<usize>,
        /// Its input's.
        want: Vec<usize>,
    },
}

impl From<ConfigError> for EngineError {
    fn from(error: ConfigError) -> Self {
        EngineError::Config(error)
    }
}

impl From<BatchError> for EngineError {
    fn from(error: BatchError) -> Self {
        EngineError::Batch(error)
    }
}

/// A setting of [`EngineConfig`] (or a use of the engine) that cannot work.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// The backend cannot compute in the chosen precision.
    #[error(transparent)]
    Precision(#[from] PrecisionError),
    /// `loss_chunk_tokens` is 0.
    #[error("loss_chunk_tokens must be at least 1")]
    LossChunk,
    /// `grad_clip` is not a positive number.
    #[error("grad_clip must be positive, got {0}")]
    GradClip(f64),
    /// A store built for the other mode.
    #[error(
        "store was built {} a gradient buffer but the engine is {}",
        if *store_has_buffer { "with" } else { "without" },
        if *fused { "fused" } else { "not fused" }
    )]
    StoreLayout {
        /// Whether the store keeps a gradient buffer.
        store_has_buffer: bool,
        /// Whether the engine is fused.
        fused: bool,
    },
    /// More micro-batches than devices in fused mode.
    #[error(
        "fused mode applies each block's update during the backward pass and cannot accumulate \
         micro-batches; use one micro-batch per device or disable fused mode"
    )]
    FusedAccumulation,
    /// An engine given no device to train on.
    #[error("an engine needs at least one device")]
    NoDevices,
    /// Devices whose gradients need a collective library that is missing.
    #[error(
        "summing gradients across {devices} GPUs needs NCCL, and neither libnccl.so.2 nor \
         libnccl.so loaded (install NCCL, e.g. `pip install nvidia-nccl-cu12`, and put the folder \
         holding libnccl.so.2 on LD_LIBRARY_PATH)"
    )]
    NoCollective {
        /// Devices asked for.
        devices: usize,
    },
    /// An engine of several devices asked to join a group of processes.
    #[error(
        "an engine in a group of processes trains on one device each (this one has {lanes}); \
         run one process per GPU"
    )]
    ProcessesWithLanes {
        /// Its devices.
        lanes: usize,
    },
    /// A gradient buffer asked of fused mode.
    #[error("fused mode keeps no gradient buffer")]
    FusedGradients,
    /// A setting that only applies below f32 compute, asked with f32.
    #[error("{0} applies only to a compute precision below fp32")]
    NeedsLowPrecision(&'static str),
    /// More micro-batches than devices with gradients kept in the compute precision.
    #[error(
        "gradients kept in the compute precision cannot accumulate micro-batches; use one \
         micro-batch per device or an f32 gradient buffer"
    )]
    CompactAccumulation,
    /// A store whose moments are not of the kind the engine keeps.
    #[error(
        "store keeps {} optimizer moments, the engine {}",
        if *store_eight_bit { "8-bit" } else { "fp32" },
        if *store_eight_bit { "fp32" } else { "8-bit" }
    )]
    MomentKind {
        /// Whether the store's moments are 8-bit.
        store_eight_bit: bool,
    },
    /// A store whose gradient buffers are not in the precision the engine keeps them in.
    #[error(
        "store keeps the blocks' gradients in {}, the engine in {}",
        if *store_bf16 { "bf16" } else { "f32" },
        if *store_bf16 { "f32" } else { "bf16" }
    )]
    GradientPrecision {
        /// Whether the store's block gradient buffers are bf16.
        store_bf16: bool,
    },
}

/// Micro-batches the engine cannot train on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BatchError {
    /// An empty list.
    #[error("no micro-batches")]
    NoMicroBatches,
    /// Inputs and targets of different shapes.
    #[error("micro-batch {index}: inputs {inputs:?} and targets {targets:?} differ in shape")]
    TargetShape {
        /// Which micro-batch.
        index: usize,
        /// Its inputs' shape.
        inputs: [usize; 2],
        /// Its targets'.
        targets: [usize; 2],
    },
    /// A micro-batch shaped unlike the first.
    #[error("micro-batch {index} has shape {shape:?}, the first has {first:?}")]
    Uneven {
        /// Which micro-batch.
        index: usize,
        /// Its shape.
        shape: [usize; 2],
        /// The first one's.
        first: [usize; 2],
    },
    /// A count of micro-batches the devices cannot share evenly.
    #[error(
        "{micro_batches} micro-batches do not split evenly over {lanes} devices; give each \
         device the same number"
    )]
    Lanes {
        /// Micro-batches given.
        micro_batches: usize,
        /// Devices the engine trains on.
        lanes: usize,
    },
    /// No tokens.
    #[error("micro-batch {index} is empty ({shape:?})")]
    Empty {
        /// Which micro-batch (0 for a sampling input).
        index: usize,
        /// Its shape.
        shape: [usize; 2],
    },
    /// Document boundaries not one per micro-batch.
    #[error("{documents} sets of document boundaries for {micro_batches} micro-batches")]
    Documents {
        /// Micro-batches given.
        micro_batches: usize,
        /// Boundaries given.
        documents: usize,
    },
    /// Document boundaries for a shape other than their micro-batch's.
    #[error("micro-batch {index}: documents for {documents:?}, inputs {inputs:?}")]
    DocumentShape {
        /// Which micro-batch.
        index: usize,
        /// The boundaries' `[batch, seq]`.
        documents: [usize; 2],
        /// The inputs'.
        inputs: [usize; 2],
    },
    /// A token outside the embedding table.
    #[error("token id {token} is outside the embedding table's {rows} rows")]
    Token {
        /// The token.
        token: i64,
        /// The table's rows.
        rows: usize,
    },
}
