//! cuDNN's fused attention on CUDA (forward and backward, causal, a sliding
//! window, grouped-query heads), through the library's backend API
//! (cudarc's `cudnn::sys` bindings) with libcudnn loaded at run time, found
//! as libcublas is: a system CUDA install or the `nvidia-cudnn-cu12/13`
//! wheel's folder on `LD_LIBRARY_PATH`.
//!
//! - `backend`: descriptors with typed attributes, and the error a refusal
//!   carries;
//! - `graph`: an operation graph built op by op and finalised into a plan
//!   by cuDNN's heuristics;
//! - `sdpa`: the two passes as graphs, in the form cuDNN's flash-attention
//!   engines recognise;
//! - `launch`: plans cached per shape, run on cubecl's stream with burn's
//!   tensors.
//!
//! Where the library is absent, switched off ([`set_cudnn_attention`]) or
//! refuses a shape, the CubeCL kernels run; the process says once which.

mod backend;
mod graph;
mod launch;
mod sdpa;

pub(crate) use launch::{backward, forward, takes};
pub use launch::{cudnn_attention_runs, cudnn_version, set_cudnn_attention};
