//! Which implementation runs attention's passes, by dtype, head width and
//! length: the fused kernels where they measured faster than the tiles on
//! the H100 (`bench/results/cuda-bench/README.md` holds the measurements).

use burn::tensor::DType;

use super::tiling::Tiling;

/// How attention's passes run.
#[derive(Debug, Clone, Copy)]
pub(super) enum Passes {
    /// [`causal_attention`](super::causal_attention)'s choice, made on the
    /// inner tensors.
    Auto,
    /// cuDNN's fused attention (CUDA, bf16 and f16), and for a pass it
    /// refuses, [`after_cudnn`]'s choice.
    Cudnn,
    /// Both in the fused kernels where they take the tensors (CUDA), else
    /// the tiling of the shape.
    Fused,
    /// The forward fused, the backward through the tiling.
    FusedForward(Tiling),
    /// Query blocks and key tiles in tensor ops.
    Tiled(Tiling),
}

/// Longest sequence whose backward runs the WMMA fused kernel (f32, or
/// 16-bit heads wider than [`MMA_BACKWARD_MAX_WIDTH`]) under
/// [`causal_attention`](super::causal_attention). Past it the query blocks
/// and key tiles' backward, whose products are cuBLAS calls, measured faster
/// on the H100 (at 4k, 16k and 64k positions); so did their forward for
/// heads of 128 values (at 16k), while for heads of 64 the fused forward ran
/// 1.8–4.8 times as fast at every length measured (1k to 64k).
pub const FUSED_BACKWARD_UP_TO: usize = 2048;

/// Widest head whose forward stays fused past [`FUSED_BACKWARD_UP_TO`] in
/// f32 (the WMMA kernels).
const FUSED_FORWARD_MAX_WIDTH: usize = 64;

/// Widest head whose backward runs the 16-bit fused kernel (`mma.sync`),
/// whose registers hold a plane's keys' `k`, `v`, `dk` and `dv`.
pub const MMA_BACKWARD_MAX_WIDTH: usize = 64;

/// Whether inputs of `dtype` run the 16-bit fused kernels (`mma.sync`, the
/// scores in registers) rather than the WMMA ones.
pub(super) fn half_precision(dtype: DType) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
}

/// [`causal_attention`](super::causal_attention)'s passes for sequences of
/// `seq` positions and heads of `head_dim` values in `dtype`, where the
/// fused kernels take the tensors: in bf16 and f16 both passes fused (past
/// [`MMA_BACKWARD_MAX_WIDTH`] the backward only up to
/// [`FUSED_BACKWARD_UP_TO`]); in f32 the WMMA kernels where they measured
/// faster than the tiles.
pub(super) fn routed(heads: usize, seq: usize, head_dim: usize, dtype: DType) -> Passes {
    let half = half_precision(dtype);
    if seq <= FUSED_BACKWARD_UP_TO || (half && head_dim <= MMA_BACKWARD_MAX_WIDTH) {
        Passes::Fused
    } else if half || head_dim <= FUSED_FORWARD_MAX_WIDTH {
        Passes::FusedForward(Tiling::new(heads, seq))
    } else {
        Passes::Tiled(Tiling::new(heads, seq))
    }
}

/// The passes for a shape cuDNN refused: the fused kernels with a window
/// (which [`Passes::Cudnn`] is chosen only where they take), else
/// [`routed`]'s choice.
pub(super) fn after_cudnn(
    heads: usize,
    seq: usize,
    head_dim: usize,
    dtype: DType,
    window: Option<usize>,
) -> Passes {
    match window {
        Some(_) => Passes::Fused,
        None => routed(heads, seq, head_dim, dtype),
    }
}

/// Whether cuDNN's fused attention takes heads of `head_dim` values in
/// `dtype` (16-bit, a multiple of 8 up to 256 wide), where the library is
/// found and not switched off.
pub fn cudnn_takes(dtype: DType, head_dim: usize) -> bool {
    half_precision(dtype) && head_dim.is_multiple_of(8) && head_dim <= 256
}

/// Bytes of device memory attention's backward of `batch` sequences of
/// `seq` positions takes besides its inputs, outputs and their gradients,
/// on the path that runs it: cuDNN's where `cudnn` (the library found and
/// allowed) and it takes the heads ([`cudnn_scratch_bytes`]); else, for
/// the CubeCL kernels, whose choice between the fused ones and the tiles
/// goes by length and width, the larger of the fused kernels' f32 sums of
/// the query gradients and the tiles' temporaries: score-sized ones
/// (scores, probabilities and their gradients, one chunk at a time) and,
/// where a sequence's keys are cut into several tiles, the f32 sums of the
/// tiles' outputs and gradients.
pub fn backward_scratch_bytes(
    batch: usize,
    heads: usize,
    kv_heads: usize,
    seq: usize,
    head_dim: usize,
    dtype: DType,
    cudnn: bool,
) -> usize {
    if cudnn && cudnn_takes(dtype, head_dim) {
        return cudnn_scratch_bytes(batch, heads, seq, head_dim);
    }
    let tiling = Tiling::new(heads, seq);
    let mut tiles = dtype.size() * 4 * tiling.score_elements(batch, heads, seq);
    if tiling.tiles_keys(seq) {
        tiles += 4 * batch * seq * (2 * heads + 2 * kv_heads) * head_dim;
    }
    tiles.max(cudnn_scratch_bytes(batch, heads, seq, head_dim))
}

/// Bytes of device memory cuDNN's backward of `batch` sequences of `seq`
/// positions with `heads` query heads of `head_dim` values takes besides its
/// inputs, outputs and the engine's workspace (which cuDNN reports only
/// once a plan is built, and measured at most a few MiB): the query
/// gradient's f32 sums and each row's f32 `rowsum(dO ⊙ O)`.
pub fn cudnn_scratch_bytes(batch: usize, heads: usize, seq: usize, head_dim: usize) -> usize {
    batch * heads * seq * (head_dim + 1) * 4
}
