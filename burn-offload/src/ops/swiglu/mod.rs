//! The SwiGLU gate, `silu(gate) ⊙ up`, as one autodiff operation.
//!
//! burn computes `silu` as `x · sigmoid(x)` and, for bf16, `sigmoid` in f32
//! over a cast: at 64k tokens of the 0.85B Llama in bf16 those casts and
//! passes over `[tokens, d_ff]` were ~0.45 s of a 2.4 s step, forward,
//! recompute and backward (measured kernel times). Here the forward keeps
//! `gate` and `up`; on CUDA the forward and the backward are one kernel each
//! (`swiglu_cuda`), f32 inside; elsewhere tensor ops. With `s = sigmoid(g)`:
//! `d gate = dout · up · s · (1 + g · (1 − s))`, `d up = dout · g · s`.

mod base;
#[cfg(feature = "cuda")]
mod cuda;

pub use base::*;
