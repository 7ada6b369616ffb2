//! burn-offload: train language models larger than GPU memory on one GPU.
//!
//! Parameters and optimizer state live in host memory ([`store::HostStore`]);
//! the GPU is a transient compute engine that sees one or two transformer
//! blocks at a time ([`pager::Pager`]). The [`engine::Engine`] runs the
//! block-streamed schedule: forward without a graph keeping block inputs,
//! chunked loss, per-block recompute and backward, CPU optimizer over host
//! slabs ([`optim`]). Models take part by implementing [`BlockModel`].

pub mod attention;
#[cfg(feature = "cuda")]
mod attention_cuda;
pub mod backend;
pub mod checkpoint;
mod copy_window;
pub mod cross_entropy;
#[cfg(feature = "cuda")]
mod cross_entropy_cuda;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod engine;
mod lookup;
#[cfg(feature = "cuda")]
mod lookup_cuda;
#[cfg(feature = "cuda")]
pub mod matmul_cuda;
pub mod model;
pub mod optim;
pub mod pager;
pub mod precision;
pub mod rms_norm;
#[cfg(feature = "cuda")]
mod rms_norm_cuda;
pub mod rotary;
#[cfg(feature = "cuda")]
mod rotary_cuda;
pub mod store;
pub mod swiglu;
#[cfg(feature = "cuda")]
mod swiglu_cuda;
pub mod trace;
mod worker;

pub use backend::gemm::{matmul_names, set_matmul, Gemm, DEFAULT_MATMUL};
pub use backend::{HostParams, Offload, OffloadTensor, ParkParams};
pub use engine::{Engine, EngineConfig, EngineError, MicroBatch, StepReport, StepSplit};
pub use model::{BlockModel, DecoderBlock};
pub use optim::{AdamWConfig, OptimizerConfig, SgdConfig};
pub use precision::Compute;
pub use store::{HostStore, StoreError};
