//! Rotary position embeddings (the "rotate half" layout) as one autodiff
//! operation: `x·cos + rotate_half(x)·sin`, `rotate_half([a, b]) = [−b, a]`
//! over the two halves of the head dimension.
//!
//! In tensor ops that is a negation, a concatenation, two products and a sum
//! over the queries and keys, each a pass autodiff records (and the tables
//! cast to bf16 in bf16 mode). The rotation is linear, so its backward is its
//! transpose, `dy·cos + rotate_half^T(dy·sin)` with `rotate_half^T([p, q]) =
//! [q, −p]` (for tables whose halves repeat, as Llama's do, the rotation by
//! the opposite angle): nothing but the tables is kept. On CUDA each way is
//! one kernel (`rotary_cuda`), f32 inside.

mod base;
#[cfg(feature = "cuda")]
mod cuda;

pub use base::*;
