//! RMSNorm, `x / sqrt(mean(x²) + ε) ⊙ γ` over the last dimension, as one
//! autodiff operation.
//!
//! burn's `RmsNorm` casts `x` to f32, squares it, takes the mean, adds ε,
//! takes the root, casts it back, divides and scales: five passes over
//! `[tokens, d_model]` forward, and autodiff records each of them, with more
//! passes backward. Here the forward keeps `x`, `γ` and each row's reciprocal
//! root `r` (f32); on CUDA the forward is one kernel and the backward two
//! (`rms_norm_cuda`), f32 inside; elsewhere tensor ops. With `x̂ = x·r` and
//! `g = dy ⊙ γ` over a row of width `n`:
//! `dx = r·(g − x̂·Σ(g ⊙ x̂)/n)`, `dγ = Σ_rows dy ⊙ x̂`.

mod base;
#[cfg(feature = "cuda")]
mod cuda;

pub use base::*;
