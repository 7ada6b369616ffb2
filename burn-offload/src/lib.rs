//! burn-offload: train language models larger than GPU memory on one GPU.
//!
//! Parameters and optimizer state live in host memory ([`HostStore`]); the
//! GPU is a transient compute engine that sees one or two transformer blocks
//! at a time. The [`Engine`] runs the block-streamed schedule: forward
//! without a graph keeping block inputs, chunked loss, per-block recompute
//! and backward, CPU optimizer over host slabs. Models take part by
//! implementing [`BlockModel`]. [`Offload<B>`](Offload) is the same idea as a
//! burn backend decorator, for a plain burn training loop, with
//! [`HostOptimizerConfig`] for its optimizer.
//!
//! The crate is layered, each layer using only those before it (checked by
//! `tests/tests/layers.rs`): `host` (slabs, row math, optimizers, the worker
//! thread; no device code) → `quant` (the frozen base's int8 and NF4
//! formats) → `store` (the host store, bf16 copies,
//! checkpoints) → `transfer` (the pager and the copy machinery's trait) →
//! `backend` (the `Offload` and `Gemm` decorators, the host optimizers) →
//! `cuda` (everything that knows burn's CUDA backend) → `precision`,
//! `matmul`, `model`, `device` (the build's copy machinery), `documents`
//! (packed windows' boundaries) → `ops` (custom
//! autodiff operations) → `engine`. docs/ARCHITECTURE.md draws a step.
#![warn(missing_docs)]

mod backend;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod documents;
mod engine;
mod host;
mod matmul;
mod model;
pub mod ops;
mod precision;
pub mod quant;
mod store;
mod transfer;

pub use backend::{
    host_update_stats, prefetch, residency, Gemm, GemmKernels, Held, HostOptimizer,
    HostOptimizerConfig, HostOptimizerState, HostParams, HostUpdateStats, MatmulError,
    OffloadTensor, OffloadWith, ParkParams, HOST_GRADIENTS_QUEUED,
};
pub use device::Offload;
pub use documents::{Documents, DocumentsError};
pub use engine::{
    BatchError, ConfigError, Engine, EngineConfig, EngineError, MicroBatch, StepReport, StepSplit,
    StreamedModel,
};
pub use host::optim::quant::QUANT_BLOCK;
pub use host::optim::{
    AdamWConfig, GradSlice, MomentSlices, OptimizerConfig, OptimizerError, SgdConfig, UpdateSlices,
};
pub use host::processes::{ProcessError, ProcessGroup};
pub use host::trace;
pub use matmul::{matmul_names, set_matmul, DEFAULT_MATMUL};
pub use model::{set_offload_recompute, BlockModel, BlockRecompute, DecoderBlock};
pub use ops::recompute::{recompute, recomputed_blocks};
pub use precision::{cast_params, cast_to, Compute, PrecisionError};
pub use store::{
    checkpoint, Frozen, FrozenAt, FrozenDtype, FrozenParams, FrozenSlot, FrozenValues, HostStore,
    HostValues, Member, MomentValues, Moments, NoHostValues, Q8Slab, StoreError, StoreLayout,
};
pub use transfer::PagerStats;

/// burn's CUDA backend as this crate sees it: the backend type, its device
/// memory, and the matmul kernels `Gemm<Cuda>` can launch.
#[cfg(feature = "cuda")]
pub mod cuda_backend {
    pub use crate::cuda::{
        cublas_matmul, dequantize_int8_cuda, dequantize_nf4_cuda, device_count, free_device_bytes,
        limit_memory_pages, matmul_stats, matmul_strategies, pool_bytes, CudaBackend, CudaError,
        MatmulStats, CUBLAS, CUBLAS_TF32, FAST,
    };
}
