//! The custom autodiff operations: each one operation on burn's autodiff
//! graph with a backward of its own, a reference in tensor ops, and (CUDA
//! builds) CubeCL kernels.

pub mod attention;
pub mod cross_entropy;
pub(crate) mod embedding;
pub mod mlp;
pub mod recompute;
pub(crate) mod record;
pub mod rms_norm;
pub mod rotary;
pub mod swiglu;
