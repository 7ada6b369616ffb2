//! Causal attention whose backward keeps `O(tokens)` values, not the
//! `[batch, heads, seq, seq]` probabilities.
//!
//! Written out in tensor ops, attention leaves autodiff a score-sized tensor
//! per block (the probabilities, 2 GiB for the 0.85B Llama at 16k tokens in
//! f32: a third of what a block keeps), and its backward runs a dozen
//! score-sized elementwise passes. On the autodiff backends this crate runs,
//! [`causal_attention`] is one autodiff operation instead, in the manner of
//! FlashAttention's backward but in plain tensor ops of the inner backend:
//! - the forward keeps `q`, `k`, `v`, the output and each row's log-sum-exp;
//! - the backward recomputes the probabilities from them (one `q·kᵀ` and one
//!   `exp`) and applies the softmax gradient in closed form,
//!   `dS = P ⊙ (dP − rowsum(dO ⊙ O))`.
//!
//! Both passes split each sequence's queries into blocks of consecutive
//! positions ([`Tiling`]); a block's queries see only the keys up to its last
//! position, so the scores of block `r` are `len × (r+1)·len`, not
//! `len × seq`: with four blocks the score-sized passes (matmuls, mask,
//! `exp`, the row reductions, the softmax gradient) cover 10/16 of the square
//! instead of all of it, the masked half being mostly skipped. They work
//! through the batch in chunks whose scores hold at most
//! [`SCORE_CHUNK_ELEMENTS`], so the score-sized temporaries stay bounded too.
//! Past the length where one block and all its keys fit that bound, the keys
//! are cut into tiles as well, as FlashAttention cuts them inside a kernel:
//! each tile's output carries its rows' log-sum-exp, the tiles' outputs are
//! combined by it, and the backward sums each tile's key and value gradients
//! over the blocks that see it; memory then grows with the sequence, not its
//! square (2048 × 2048 tiles for 32 heads).
//! Grouped-query attention needs no repeated keys and values: the `g` query
//! heads of one key/value head are laid end to end (`[b, kv, g·s, d]`), and
//! one matmul serves the group (its key and value gradients come out summed
//! over the group).
//!
//! On CUDA in bf16 and f16, both passes are cuDNN's fused attention where
//! libcudnn (9.0 or later) is found at run time and takes the shape
//! (`cudnn`: the backend API's graph that its flash-attention engines
//! run, causal, grouped-query heads read in place, the sliding window as
//! a diagonal band); the process says once which path it took. Where it
//! is absent, refuses a shape or is switched off
//! (`set_cudnn_attention`), the crate's own kernels below run.
//!
//! On CUDA, for head widths of 16, 32, 64 or 128, the passes are instead
//! fused FlashAttention-2-style CubeCL kernels on tensor cores (`flash`),
//! one cube walking a tile of 64 queries (or keys) across the tiles of the
//! other side: for bf16 and f16 on `mma.sync` with the scores in registers,
//! both passes at every length (the backward for heads of at most
//! [`MMA_BACKWARD_MAX_WIDTH`]; wider heads' backward up to
//! [`FUSED_BACKWARD_UP_TO`] positions); for f32 on WMMA with the scores in
//! shared memory, both passes up to [`FUSED_BACKWARD_UP_TO`] and past that
//! the forward for heads of at most 64 values (`route.rs` says where each
//! runs). [`causal_attention_fused`] runs both passes fused at any length
//! and [`causal_attention_tiled`] neither (the tests' and benchmarks'
//! handles on each).
//!
//! [`windowed_attention`] adds a sliding window (Mistral's): each position
//! sees itself and the `window − 1` positions before it. The fused kernels
//! skip the tiles outside the window and mask the rest; where they do not
//! run, the reference formulation does (the tiles have no window mask).
//!
//! [`causal_attention_in`] and [`windowed_attention_in`] take the document
//! boundaries of packed windows ([`Documents`](crate::Documents)): no
//! position sees another document's. The query blocks and key tiles mask
//! across documents and skip the tiles before a block's documents; the
//! fused kernels know no documents, so those calls do not reach them
//! (`packed.rs`).
//!
//! [`single_query_attention`] is generation's step: one new position over
//! a key/value cache, forward only (one kernel on CUDA).
//!
//! Other autodiff backends get [`reference_causal_attention`], which burn
//! differentiates op by op; graph-free backends get the forward alone.

mod base;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cudnn;
mod decode;
#[cfg(feature = "cuda")]
mod decode_cuda;
#[cfg(feature = "cuda")]
mod flash;
mod memo;
mod packed;
mod route;
mod tiling;

pub use base::*;
#[cfg(feature = "cuda")]
pub use cudnn::{cudnn_attention_runs, cudnn_version, set_cudnn_attention};
pub use decode::single_query_attention;
pub use memo::{capture, replay, replayed_attention_outputs, AttentionMemo};
pub use packed::{
    causal_attention_in, causal_attention_tiled_in, reference_attention_in, windowed_attention_in,
};
pub use route::{
    backward_scratch_bytes, cudnn_scratch_bytes, cudnn_takes, FUSED_BACKWARD_UP_TO,
    MMA_BACKWARD_MAX_WIDTH,
};
pub use tiling::{Tiling, QUERY_BLOCKS, SCORE_CHUNK_ELEMENTS};
