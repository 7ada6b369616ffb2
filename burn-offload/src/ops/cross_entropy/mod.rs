//! Next-token cross-entropy as one autodiff operation.
//!
//! Written out in tensor ops (cast to f32, `log_softmax`, gather), the loss
//! leaves autodiff a dozen `tokens × vocab` passes in f32, forward and
//! backward: at 64k tokens of the 0.85B Llama in bf16 that was ~0.6 s of a
//! 2.7 s step (measured kernel times), for a loss whose gradient is one
//! expression. Here the forward keeps the logits (as they are, any float
//! dtype) and each row's log-sum-exp in f32, and the backward writes
//! `dlogits = g · (softmax(logits) − onehot(target))` in the logits' dtype.
//! On burn's CUDA backend both are one kernel each (`cross_entropy_cuda`):
//! three passes over the logits in all. Elsewhere they are tensor ops, in f32.
//!
//! Other autodiff backends get [`reference_nll_rows`], which burn
//! differentiates op by op.

mod base;
#[cfg(feature = "cuda")]
mod cuda;

pub use base::*;
