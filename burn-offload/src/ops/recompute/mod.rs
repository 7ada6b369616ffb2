//! Per-block recompute for plain burn code: a checkpoint operation that keeps
//! only its input and rebuilds its graph in the backward, and the
//! `BlockRecompute` implementation that runs a model's blocks through it on
//! `Autodiff<Offload<_>>`.

mod base;

pub use base::{recompute, recomputed_blocks};
