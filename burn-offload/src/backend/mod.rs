//! `Offload<B>`: a burn `Backend` decorator whose parameters live in host memory.
//!
//! A float tensor of `Offload<B>` is either **host-resident** (created by
//! initialisation or loading: `from_data`, `random`, `zeros`, …, or *parked*
//! by moving it to the device with `to_device`) or an ordinary tensor of the
//! inner backend (every result of an operation). When an operation reads a
//! host-resident operand, the operand is paged in ([`residency`]): uploaded
//! once, cached on the device while the cache has room, evicted least recently
//! used first. Int, bool and quantized tensors are the inner backend's own.
//!
//! The device of `Offload<B>` is `B::Device`: to burn, every tensor sits on the
//! same device, so modules and optimizers work unchanged. Moving a tensor to
//! that device parks it in host memory; that is how optimizer state and (with
//! [`ParkParams`]) parameters return to the host after each step.
//!
//! Op forwarding: `forwarded.rs` (generated from burn-backend's trait sources by
//! `codegen/forward_ops.py`) lists ~350 methods; the `forward_fns!` macro turns
//! each into a call of `B`'s method with operands paged in and float results
//! wrapped. `ops.rs` holds the handful written by hand. `gemm.rs` reuses the
//! lists for `Gemm<B>`, which forwards everything but the matmul as is.

#[macro_use]
mod forward;
#[macro_use]
mod forwarded;
mod draw;
mod gemm;
mod host_optim;
mod offload;
mod ops;
pub mod prefetch;
pub mod residency;

pub(crate) use draw::{host_draws, rewind_host_draws};
pub use gemm::{Gemm, GemmKernels, MatmulError};
pub(crate) use host_optim::park_queued;
pub use host_optim::{
    host_update_stats, HostOptimizer, HostOptimizerConfig, HostOptimizerState, HostUpdateStats,
    HOST_GRADIENTS_QUEUED,
};
pub(crate) use offload::{lower, read_to_host, to_device_uncached, HostTensor};
pub use offload::{Held, HostParams, OffloadTensor, OffloadWith, ParkParams};
