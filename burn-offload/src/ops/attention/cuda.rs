//! [`crate::attention`]'s score-sized passes as CubeCL kernels on burn's CUDA
//! backend: in tensor ops a query block's softmax was a mask, a max, a
//! subtraction, an `exp` and a sum over the scores (forward), and a mask, two
//! subtractions, an `exp` and a product (backward), each a full pass over
//! `[b, kv, g·len, keys]` values; at 64k tokens of the 0.85B Llama in bf16
//! they were ~0.6 s of a 2.7 s step (measured kernel times).
//! - `softmax_rows_kernel` (forward): a plane per row finds the maximum and
//!   the sum of `exp(s − max)` over the keys the row's query sees, then writes
//!   the probabilities (zero past the diagonal) and the row's log-sum-exp in
//!   f32;
//! - `softmax_grad_kernel` (backward): a plane per row writes
//!   `p = exp(s − lse)` and `p · (dp − rowsum(dO ⊙ O))`, zero past the
//!   diagonal, reading nothing there;
//! - `combine_kernel` and `accumulate_kernel`: where a sequence's keys are cut
//!   into several tiles, the tiles' outputs are combined by their log-sum-exp
//!   and the gradients summed, into f32, a unit per value.
//!
//! The scores of a query block over one key tile are `[b, kv, g·len, keys]`:
//! row `i` along the third dimension is the block's query `i mod len`, which
//! sees the tile's keys `0..=offset + i mod len` (the block's first query is
//! `offset` positions past the tile's first key). All arithmetic is f32.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, CubeCount, CubeDim};

use crate::cuda::{as_float, empty_like, float_cube, is_float};

/// The kernels, apart: cubecl's prelude has a `Tensor` of its own.
mod kernels {
    use cubecl::prelude::*;

    /// Offset of row `row` of a `[b, h, rows, _]` tensor, through its strides.
    #[cube]
    fn row_offset<E: CubePrimitive>(t: &Tensor<E>, row: usize) -> usize {
        let rows = t.shape(2);
        let heads = t.shape(1);
        let i2 = row % rows;
        let i1 = (row / rows) % heads;
        let i0 = row / (rows * heads);
        i0 * t.stride(0) + i1 * t.stride(1) + i2 * t.stride(2)
    }

    /// Keys of the tile the query of row `row` sees (`0..visible`): the
    /// block's query `i` sees keys `0..=offset + i`, at most the tile's.
    #[cube]
    fn visible_keys(row: usize, rows: usize, keys: usize, offset: u32, len: u32) -> usize {
        let visible = offset as usize + (row % rows) % len as usize + 1;
        if visible > keys {
            keys
        } else {
            visible
        }
    }

    #[cube(launch)]
    pub(super) fn softmax_rows_kernel<F: Float>(
        scores: &Tensor<F>,
        probs: &mut Tensor<F>,
        lse: &mut Tensor<f32>,
        offset: u32,
        len: u32,
        #[define(F)] _dtype: StorageType,
    ) {
        let row = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
        let rows = scores.shape(2);
        if row >= scores.shape(0) * scores.shape(1) * rows {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let lanes = CUBE_DIM_X as usize;
        let keys = scores.shape(3);
        let visible = visible_keys(row, rows, keys, offset, len);
        let base = row_offset(scores, row);
        let step = scores.stride(3);

        let mut max = f32::new(-3.0e38);
        let mut key = lane;
        while key < visible {
            let s = f32::cast_from(scores[base + key * step]);
            if s > max {
                max = s;
            }
            key += lanes;
        }
        let max = plane_max(max);
        let mut sum = f32::new(0.0);
        let mut key = lane;
        while key < visible {
            sum += (f32::cast_from(scores[base + key * step]) - max).exp();
            key += lanes;
        }
        let sum = plane_sum(sum);
        let inverse = f32::new(1.0) / sum;

        let out = row_offset(probs, row);
        let out_step = probs.stride(3);
        let mut key = lane;
        while key < keys {
            let mut p = f32::new(0.0);
            if key < visible {
                p = (f32::cast_from(scores[base + key * step]) - max).exp() * inverse;
            }
            probs[out + key * out_step] = F::cast_from(p);
            key += lanes;
        }
        if lane == 0 {
            lse[row_offset(lse, row)] = max + sum.ln();
        }
    }

    #[cube(launch)]
    pub(super) fn softmax_grad_kernel<F: Float>(
        scores: &Tensor<F>,
        dprobs: &Tensor<F>,
        lse: &Tensor<f32>,
        row_dot: &Tensor<F>,
        probs: &mut Tensor<F>,
        dscores: &mut Tensor<F>,
        offset: u32,
        len: u32,
        #[define(F)] _dtype: StorageType,
    ) {
        // A plane per row, as in the forward: the row's offsets are found
        // once per lane, not once per score (a unit per score spent most of
        // its time in 64-bit index divisions: 6× the forward's time).
        let row = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
        let rows = probs.shape(2);
        if row >= probs.shape(0) * probs.shape(1) * rows {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let lanes = CUBE_DIM_X as usize;
        let keys = probs.shape(3);
        let visible = visible_keys(row, rows, keys, offset, len);
        let (s_base, s_step) = (row_offset(scores, row), scores.stride(3));
        let (d_base, d_step) = (row_offset(dprobs, row), dprobs.stride(3));
        let (p_base, p_step) = (row_offset(probs, row), probs.stride(3));
        let (g_base, g_step) = (row_offset(dscores, row), dscores.stride(3));
        let row_lse = lse[row_offset(lse, row)];
        let dot = f32::cast_from(row_dot[row_offset(row_dot, row)]);
        let mut key = lane;
        while key < keys {
            let mut p = f32::new(0.0);
            let mut ds = f32::new(0.0);
            if key < visible {
                p = (f32::cast_from(scores[s_base + key * s_step]) - row_lse).exp();
                ds = p * (f32::cast_from(dprobs[d_base + key * d_step]) - dot);
            }
            probs[p_base + key * p_step] = F::cast_from(p);
            dscores[g_base + key * g_step] = F::cast_from(ds);
            key += lanes;
        }
    }

    /// Two tiles' outputs of the same rows as one (a unit per value): the
    /// f32 sum so far and the next tile's output, each weighted by its
    /// share `exp(lse − lse_new)` of the joint denominator. Contiguous
    /// `[b, kv, rows, d]` and `[b, kv, rows, 1]` tensors.
    #[cube(launch)]
    pub(super) fn combine_kernel<F: Float>(
        sum: &Tensor<f32>,
        sum_lse: &Tensor<f32>,
        part: &Tensor<F>,
        part_lse: &Tensor<f32>,
        out: &mut Tensor<f32>,
        out_lse: &mut Tensor<f32>,
        #[define(F)] _dtype: StorageType,
    ) {
        let i = ABSOLUTE_POS;
        if i >= out.len() {
            terminate!();
        }
        let width = out.shape(3);
        let row = i / width;
        let (a, b) = (sum_lse[row], part_lse[row]);
        let mut max = a;
        if b > a {
            max = b;
        }
        let (wa, wb) = ((a - max).exp(), (b - max).exp());
        let total = wa + wb;
        out[i] = (sum[i] * wa + f32::cast_from(part[i]) * wb) / total;
        if i == row * width {
            out_lse[row] = max + total.ln();
        }
    }

    /// `sum + part` into a new f32 tensor (a unit per value, contiguous).
    #[cube(launch)]
    pub(super) fn accumulate_kernel<F: Float>(
        sum: &Tensor<f32>,
        part: &Tensor<F>,
        out: &mut Tensor<f32>,
        #[define(F)] _dtype: StorageType,
    ) {
        let i = ABSOLUTE_POS;
        if i >= out.len() {
            terminate!();
        }
        out[i] = sum[i] + f32::cast_from(part[i]);
    }
}
use kernels::{accumulate_kernel, combine_kernel, softmax_grad_kernel, softmax_rows_kernel};

/// The launch of a plane-per-row kernel over the rows of a `[b, h, rows,
/// keys]` shape.
fn plane_per_row(shape: &[usize]) -> Option<(CubeCount, CubeDim)> {
    crate::cuda::plane_per_row(shape[..3].iter().product(), shape[3])
}

/// The probabilities of a query block's (scaled, unmasked) `scores` over one
/// key tile and each row's log-sum-exp, f32 `[b, kv, g·len, 1]`, for a block
/// of `len` queries whose first is `offset` keys past the tile's first;
/// `None` off CUDA.
pub(crate) fn softmax_forward<B: Backend>(
    scores: &Tensor<B, 4>,
    offset: usize,
    len: usize,
) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
    let s = float_cube(scores)?;
    if !is_float(s.dtype) {
        return None;
    }
    let shape = s.meta.shape().to_vec();
    let new = |dims: [usize; 4], dtype| {
        empty_device_contiguous_dtype(s.client.clone(), s.device.clone(), Shape::new(dims), dtype)
    };
    let probs = new([shape[0], shape[1], shape[2], shape[3]], s.dtype);
    let lse = new([shape[0], shape[1], shape[2], 1], DType::F32);
    if let Some((cubes, cube_dim)) = plane_per_row(&shape) {
        softmax_rows_kernel::launch::<CudaRuntime>(
            &s.client,
            cubes,
            cube_dim,
            s.clone().into_tensor_arg(),
            probs.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            offset as u32,
            len as u32,
            s.dtype.into(),
        );
    }
    Some((as_float(probs), as_float(lse)))
}

/// `(p, p ⊙ (dp − row_dot))` for a query block's recomputed `scores`, the
/// probabilities' gradient `dprobs` (same shape), the forward's `lse` (f32)
/// and `row_dot = rowsum(dO ⊙ O)` (`[b, kv, g·len, 1]` each), with `offset`
/// and `len` as for [`softmax_forward`]; `None` off CUDA.
pub(crate) fn softmax_backward<B: Backend>(
    scores: &Tensor<B, 4>,
    dprobs: &Tensor<B, 4>,
    lse: &Tensor<B, 4>,
    row_dot: &Tensor<B, 4>,
    offset: usize,
    len: usize,
) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
    let (s, dp) = (float_cube(scores)?, float_cube(dprobs)?);
    let (lse, row_dot) = (float_cube(lse)?, float_cube(row_dot)?);
    if !is_float(s.dtype)
        || dp.dtype != s.dtype
        || row_dot.dtype != s.dtype
        || lse.dtype != DType::F32
        || dp.meta.shape() != s.meta.shape()
    {
        return None;
    }
    let dims = s.meta.shape().to_vec();
    let shape = Shape::new([dims[0], dims[1], dims[2], dims[3]]);
    let new = || {
        empty_device_contiguous_dtype(s.client.clone(), s.device.clone(), shape.clone(), s.dtype)
    };
    let (probs, dscores) = (new(), new());
    if let Some((cubes, cube_dim)) = plane_per_row(&dims) {
        softmax_grad_kernel::launch::<CudaRuntime>(
            &s.client,
            cubes,
            cube_dim,
            s.clone().into_tensor_arg(),
            dp.into_tensor_arg(),
            lse.into_tensor_arg(),
            row_dot.into_tensor_arg(),
            probs.clone().into_tensor_arg(),
            dscores.clone().into_tensor_arg(),
            offset as u32,
            len as u32,
            s.dtype.into(),
        );
    }
    Some((as_float(probs), as_float(dscores)))
}

/// Units per cube of the one-unit-per-value kernels.
const UNITS: u32 = 256;

/// A new contiguous f32 tensor of `shape` beside `t`.
fn new_f32(t: &CubeTensor<CudaRuntime>, shape: &[usize]) -> CubeTensor<CudaRuntime> {
    empty_like(t, shape, DType::F32)
}

/// [`super::base`]'s combination of two tiles' outputs in one kernel: the f32
/// `sum` and `sum_lse`, and a tile's `part` (a float dtype) with its f32
/// `part_lse`; `None` off CUDA or for other dtypes.
pub(crate) fn combine<B: Backend>(
    sum: &Tensor<B, 4>,
    sum_lse: &Tensor<B, 4>,
    part: &Tensor<B, 4>,
    part_lse: &Tensor<B, 4>,
) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
    let (sum, sum_lse) = (float_cube(sum)?, float_cube(sum_lse)?);
    let (part, part_lse) = (float_cube(part)?, float_cube(part_lse)?);
    if [&sum, &sum_lse, &part_lse]
        .iter()
        .any(|t| t.dtype != DType::F32)
        || !is_float(part.dtype)
        || part.meta.shape() != sum.meta.shape()
        || part_lse.meta.shape() != sum_lse.meta.shape()
    {
        return None;
    }
    let [sum, sum_lse, part, part_lse] = [sum, sum_lse, part, part_lse].map(into_contiguous);
    let out = new_f32(&sum, sum.meta.shape());
    let out_lse = new_f32(&sum, sum_lse.meta.shape());
    let elements = sum.meta.shape().num_elements();
    if elements > 0 {
        let cube_dim = CubeDim::new_1d(UNITS);
        combine_kernel::launch::<CudaRuntime>(
            &sum.client,
            calculate_cube_count_elemwise(&sum.client, elements, cube_dim),
            cube_dim,
            sum.clone().into_tensor_arg(),
            sum_lse.into_tensor_arg(),
            part.clone().into_tensor_arg(),
            part_lse.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            out_lse.clone().into_tensor_arg(),
            part.dtype.into(),
        );
    }
    Some((as_float(out), as_float(out_lse)))
}

/// `sum + part` in one kernel for an f32 `sum` and a `part` of its shape in
/// any float dtype; `None` off CUDA or otherwise.
pub(crate) fn accumulate<B: Backend>(
    sum: &Tensor<B, 4>,
    part: &Tensor<B, 4>,
) -> Option<Tensor<B, 4>> {
    let (sum, part) = (float_cube(sum)?, float_cube(part)?);
    if sum.dtype != DType::F32 || !is_float(part.dtype) || part.meta.shape() != sum.meta.shape() {
        return None;
    }
    let [sum, part] = [sum, part].map(into_contiguous);
    let out = new_f32(&sum, sum.meta.shape());
    let elements = sum.meta.shape().num_elements();
    if elements > 0 {
        let cube_dim = CubeDim::new_1d(UNITS);
        accumulate_kernel::launch::<CudaRuntime>(
            &sum.client,
            calculate_cube_count_elemwise(&sum.client, elements, cube_dim),
            cube_dim,
            sum.clone().into_tensor_arg(),
            part.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            part.dtype.into(),
        );
    }
    Some(as_float(out))
}

/// `t` laid out row-major, copied if it is not (and `t` itself off CUDA).
/// Keys and values arrive as `[b, s, kv, d]` buffers viewed `[b, kv, s, d]`:
/// cuBLAS cannot walk both batch dimensions of such a view with one stride,
/// so every score and value product became a loop of a call per sequence,
/// ~25k small launches a step that the host could not issue as fast as the
/// GPU ran them. One copy of the keys and values per pass
/// makes each product one call.
pub(crate) fn dense<B: Backend>(t: Tensor<B, 4>) -> Tensor<B, 4> {
    match float_cube(&t) {
        Some(c) => as_float(into_contiguous(c)),
        None => t,
    }
}
