//! Causal attention as two fused CubeCL kernels on CUDA, in the manner of
//! FlashAttention-2: the scores never leave the multiprocessor, so a pass
//! keeps `O(tokens)` values and reads `q`, `k`, `v` once per tile instead of
//! writing and reading a score tile per elementwise step. A sliding window
//! (the `window` argument; the sequence's length for none) skips the tiles
//! outside it and masks the rest.
//! - `forward_kernel`: a cube per 64 queries of one head walks the key tiles
//!   up to the diagonal with an online softmax, and writes the output and
//!   each row's log-sum-exp (f32);
//! - `backward_kernel`: a cube per 64 keys of one key/value head walks the
//!   query tiles at or past them, for each query head of the group, sums
//!   `dv = pᵀ·do` and `dk = dsᵀ·q` in its registers (the group's heads in
//!   one place), and adds each query tile's `ds·k` to f32 sums of `dq` with
//!   atomic adds (every key tile adds to the same queries).
//!
//! The products run on tensor cores through cubecl's `cmma` (CUDA's WMMA):
//! 16×16×16 tiles of bf16 or f16, or 16×16×8 of tf32 for f32 inputs (the
//! precision burn's f32 matmul runs in), accumulating in f32. Each plane
//! (warp) owns 16 rows of its cube's 64; the softmax and its gradient are
//! f32, two lanes a row. Whole key tiles above the diagonal are never
//! visited; rows past the sequence's end are zeros, so any length works.
//! The backward runs FlashAttention-2's five products a tile.
//!
//! For bf16 and f16 (the training compute types), `mma` and `mma_backward`
//! hold the same two passes on `mma.sync` with the scores, probabilities and
//! their gradients in registers, FlashAttention-2's own layout (the backward
//! for heads of at most 64 values). With such heads each plane holds 32 rows
//! in two blocks of 16, so each fragment read from shared memory feeds two
//! products: the forward a cube per 128 queries, the backward a cube per 128
//! keys, its next query tile coming in through `cp.async`. The WMMA kernels
//! above run f32 (as tf32) and the 16-bit backward of wider heads. Those read
//! their tiles in 16-byte vectors (`tiles`).
//!
//! Every kernel's grid has heads along x and tiles along y, and takes its
//! heaviest tiles at the lowest y: the GPU starts cubes x first, so every
//! head's heaviest cubes start before any head's lighter ones.

mod kernels;
mod launch;
mod mma;
mod mma_backward;
mod tiles;

pub(crate) use launch::{backward, forward, takes};
