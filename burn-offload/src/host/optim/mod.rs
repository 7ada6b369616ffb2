//! Optimizers over host slabs: AdamW (numerically burn-optim's) and SGD with
//! momentum, as fused loops over `&mut [f32]` split across threads by rayon.
//!
//! Each element's update reads and writes its parameter, moments and gradient
//! once, with no branches in the loop, so the compiler vectorises it; one
//! step over a slab is one pass over memory instead of the ~10 passes of
//! tensor-op optimizers. The per-element math (`adamw`, `sgd`) is kept apart
//! from how a group's slabs are walked (`slices`).

mod adamw;
mod config;
pub mod quant;
mod sgd;
mod slices;
#[cfg(test)]
mod tests;

pub use adamw::AdamWConfig;
pub use config::{check_lr, OptimizerConfig, OptimizerError};
pub use sgd::SgdConfig;
pub(crate) use slices::CHUNK;
pub use slices::{GradSlice, MomentSlices, Rows, UpdateSlices};
