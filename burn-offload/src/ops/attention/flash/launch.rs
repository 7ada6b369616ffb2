//! Launching the fused kernels on burn's CUDA tensors.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::zeros_client;
use burn_cubecl::tensor::CubeTensor;
use cubecl::ir::{ElemType, FloatKind, StorageType};
use cubecl::{CubeCount, CubeDim};

use super::super::route::{half_precision, MMA_BACKWARD_MAX_WIDTH};
use super::kernels::{backward_kernel, forward_kernel, PLANES, TILE, UNITS};
use super::mma::forward_mma_kernel;
use super::mma_backward::{backward_mma_kernel, BACKWARD_KEYS};
use super::tiles::OCTET;
use crate::cuda::{as_float, empty_like, float_cube};
use crate::precision::cast_to;

/// The stage type and WMMA depth for inputs of `dtype`: bf16 and f16 as
/// themselves (16×16×16), f32 as tf32 (16×16×8).
fn stage(dtype: DType) -> Option<(StorageType, usize)> {
    match dtype {
        DType::BF16 | DType::F16 => Some((dtype.into(), 16)),
        DType::F32 => Some((StorageType::Scalar(ElemType::Float(FloatKind::TF32)), 8)),
        _ => None,
    }
}

/// Whether the fused kernels take inputs of `dtype` with heads of `head_dim`
/// values. The width is a multiple of the WMMA tile (16) that divides the
/// cube's units, as the loads give each unit one column: 16, 32, 64 or 128
/// (Llama, Mistral and Qwen use 64 and 128; others run the tiled path).
fn supports(dtype: DType, head_dim: usize) -> bool {
    stage(dtype).is_some() && head_dim.is_multiple_of(16) && UNITS.is_multiple_of(head_dim)
}

/// The kernels' window: positions a query sees, the sequence's length
/// where there is no window (then every earlier key is in it); `None` past
/// what the kernels' 32-bit argument holds.
fn window_arg(window: Option<usize>, seq: usize) -> Option<u32> {
    u32::try_from(window.unwrap_or(seq).min(seq)).ok()
}

/// Whether the passes of inputs of `dtype` with heads of `head_dim` values
/// run the `mma.sync` kernels rather than the WMMA ones: `(forward,
/// backward)`.
fn on_mma(dtype: DType, head_dim: usize) -> (bool, bool) {
    let half = half_precision(dtype);
    (half, half && head_dim <= MMA_BACKWARD_MAX_WIDTH)
}

/// Whether the `mma` kernels can read `t` (`[b, h, s, d]`) in 16-byte
/// vectors (`tiles`): each row's values contiguous, and every other stride
/// (of an axis longer than 1, whose index varies) a multiple of 8 values.
/// Its start is on a 16-byte boundary as cubecl's own vectorised kernels
/// assume: a slice keeps an offset into its buffer only at the memory
/// alignment (512 bytes on CUDA), and is copied otherwise.
fn reads_as_octets(t: &CubeTensor<CudaRuntime>) -> bool {
    let (shape, strides) = (t.meta.shape(), t.meta.strides());
    strides[3] == 1 && (0..3).all(|i| shape[i] == 1 || strides[i].is_multiple_of(OCTET))
}

/// `t` as the `mma` kernels read it: itself, or a contiguous copy (whose
/// strides are multiples of the head's width, itself of 16).
fn as_octets(t: CubeTensor<CudaRuntime>) -> CubeTensor<CudaRuntime> {
    if reads_as_octets(&t) {
        t
    } else {
        into_contiguous(t)
    }
}

/// Blocks of 16 query rows each plane of the `mma` forward holds: two for
/// heads of at most 64 values (each fragment of keys and values read from
/// shared memory then feeds two products), one for wider heads, whose
/// output and scores would not fit the registers twice.
fn forward_blocks(head_dim: usize) -> usize {
    if head_dim <= 64 {
        2
    } else {
        1
    }
}

/// The cubes of a pass over `tiles` tiles of `heads` heads of `batch`
/// sequences: heads along x, tiles along y, so that the GPU, which starts
/// cubes in order of x first, starts every head's heaviest tile (the
/// kernels take them first) before any head's lighter ones. Started head
/// by head instead, the last heads' heavy cubes start late and run alone
/// at the end: a fifth of the backward's time at 16k tokens. `None` past
/// CUDA's 65,535 cubes along y.
fn launch_geometry(tiles: usize, heads: usize, batch: usize) -> Option<(CubeCount, CubeDim)> {
    let tiles = u32::try_from(tiles)
        .ok()
        .filter(|&t| t <= u16::MAX.into())?;
    Some((
        CubeCount::Static(heads as u32, tiles, batch as u32),
        CubeDim::new_2d(32, PLANES as u32),
    ))
}

/// The CUDA tensors of `ts` if all are CUDA tensors of one supported dtype
/// with heads of a supported width.
fn cubes<B: Backend, const N: usize>(
    ts: [&Tensor<B, 4>; N],
) -> Option<[CubeTensor<CudaRuntime>; N]> {
    let dtype = ts[0].dtype();
    let dim = ts[0].dims()[3];
    if !supports(dtype, dim) || ts.iter().any(|t| t.dtype() != dtype) {
        return None;
    }
    let mut out = Vec::with_capacity(N);
    for t in ts {
        out.push(float_cube(t)?);
    }
    out.try_into().ok()
}

/// The output `[b, h, s, d]` and each row's log-sum-exp (f32 `[b, h, s, 1]`)
/// of causal attention of `q: [b, h, s, d]` over `k, v: [b, kv, s, d]`,
/// each position seeing at most `window` positions where there is one;
/// `None` unless these are CUDA tensors the kernels take.
pub(crate) fn forward<B: Backend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    window: Option<usize>,
) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
    let [q, k, v] = cubes([q, k, v])?;
    let [batch, heads, seq, dim] = <[usize; 4]>::try_from(q.meta.shape().to_vec()).ok()?;
    let (stage_type, ks) = stage(q.dtype)?;
    let window = window_arg(window, seq)?;
    let out = empty_like(&q, &[batch, heads, seq, dim], q.dtype);
    let lse = empty_like(&q, &[batch, heads, seq, 1], DType::F32);
    if batch * heads * seq > 0 {
        let mma = on_mma(q.dtype, dim).0;
        // The WMMA kernel's cubes take one tile of queries each.
        let blocks = if mma { forward_blocks(dim) } else { 1 };
        let (cubes, cube_dim) = launch_geometry(seq.div_ceil(TILE * blocks), heads, batch)?;
        // SAFETY: the kernels index in bounds by construction: the loads
        // clamp positions past the sequence's end to its last row, and
        // the stores are guarded by the sequence's length.
        let scale = 1.0 / (dim as f32).sqrt();
        unsafe {
            if mma {
                forward_mma_kernel::launch_unchecked::<CudaRuntime>(
                    &q.client,
                    cubes,
                    cube_dim,
                    as_octets(q.clone()).into_tensor_arg(),
                    as_octets(k).into_tensor_arg(),
                    as_octets(v).into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    lse.clone().into_tensor_arg(),
                    scale,
                    window,
                    dim,
                    blocks,
                    q.dtype.into(),
                );
                return Some((as_float(out), as_float(lse)));
            }
            forward_kernel::launch_unchecked::<CudaRuntime>(
                &q.client,
                cubes,
                cube_dim,
                q.clone().into_tensor_arg(),
                k.into_tensor_arg(),
                v.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                lse.clone().into_tensor_arg(),
                scale,
                window,
                dim,
                ks,
                q.dtype.into(),
                stage_type,
            );
        }
    }
    Some((as_float(out), as_float(lse)))
}

/// `[dq, dk, dv]` of [`forward`] for the output gradient `grad: [b, h, s,
/// d]`, from its inputs, the forward's log-sum-exp and `dot = rowsum(grad ⊙
/// output)` (f32 `[b, h, s, 1]` each), and the forward's `window`; `None`
/// unless these are CUDA tensors the kernels take.
pub(crate) fn backward<B: Backend>(
    [q, k, v, grad]: [&Tensor<B, 4>; 4],
    lse: &Tensor<B, 4>,
    dot: &Tensor<B, 4>,
    window: Option<usize>,
) -> Option<[Tensor<B, 4>; 3]> {
    let [q, k, v, grad] = cubes([q, k, v, grad])?;
    let (lse, dot) = (float_cube(lse)?, float_cube(dot)?);
    if lse.dtype != DType::F32 || dot.dtype != DType::F32 {
        return None;
    }
    let [batch, heads, seq, dim] = <[usize; 4]>::try_from(q.meta.shape().to_vec()).ok()?;
    let kv_heads = k.meta.shape()[1];
    let (stage_type, ks) = stage(q.dtype)?;
    let window = window_arg(window, seq)?;
    let dtype = q.dtype;
    // The query gradients are sums over key tiles: f32, from zero.
    let dq = zeros_client(
        q.client.clone(),
        q.device.clone(),
        Shape::new([batch, heads, seq, dim]),
        DType::F32,
    );
    let dk = empty_like(&q, &[batch, kv_heads, seq, dim], dtype);
    let dv = empty_like(&q, &[batch, kv_heads, seq, dim], dtype);
    let scale = 1.0 / (dim as f32).sqrt();
    if batch * heads * seq > 0 {
        let client = q.client.clone();
        let mma = on_mma(dtype, dim).1;
        let keys = if mma { BACKWARD_KEYS } else { TILE };
        let (cubes, cube_dim) = launch_geometry(seq.div_ceil(keys), kv_heads, batch)?;
        // SAFETY: as for the forward.
        unsafe {
            if mma {
                backward_mma_kernel::launch_unchecked::<CudaRuntime>(
                    &client,
                    cubes,
                    cube_dim,
                    as_octets(q).into_tensor_arg(),
                    as_octets(k).into_tensor_arg(),
                    as_octets(v).into_tensor_arg(),
                    as_octets(grad).into_tensor_arg(),
                    lse.into_tensor_arg(),
                    dot.into_tensor_arg(),
                    dq.clone().into_tensor_arg(),
                    dk.clone().into_tensor_arg(),
                    dv.clone().into_tensor_arg(),
                    scale,
                    window,
                    dim,
                    dtype.into(),
                );
            } else {
                backward_kernel::launch_unchecked::<CudaRuntime>(
                    &client,
                    cubes,
                    cube_dim,
                    q.into_tensor_arg(),
                    k.into_tensor_arg(),
                    v.into_tensor_arg(),
                    grad.into_tensor_arg(),
                    lse.into_tensor_arg(),
                    dot.into_tensor_arg(),
                    dq.clone().into_tensor_arg(),
                    dk.clone().into_tensor_arg(),
                    dv.clone().into_tensor_arg(),
                    scale,
                    window,
                    dim,
                    ks,
                    dtype.into(),
                    stage_type,
                );
            }
        }
    }
    let dq = cast_to(as_float::<B, 4>(dq) * scale, dtype);
    Some([dq, as_float(dk), as_float(dv)])
}

/// Whether the fused kernels take `q` (a CUDA tensor of a dtype and head
/// width they run).
pub(crate) fn takes<B: Backend>(q: &Tensor<B, 4>) -> bool {
    cubes([q]).is_some()
}
