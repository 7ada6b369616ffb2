//! [`super::single_query_attention`] as one CubeCL kernel on burn's CUDA
//! backend: a cube per query head walks its key/value head's keys in chunks
//! of one per unit, with an online softmax (f32) over the chunks. A unit
//! scores its key of the chunk (its dot product with the query, which the
//! cube holds in shared memory); then, after the chunk's maximum, unit `d`
//! adds the chunk's weighted values of column `d` (a row of values is read
//! by consecutive units). The keys and values are read through their
//! strides, as views of a cache longer than the positions seen.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use burn_cubecl::cubecl::cuda::CudaRuntime;
use cubecl::{CubeCount, CubeDim};

use crate::cuda::{as_float, empty_like, float_cube, is_float};

/// Units per cube: a chunk's keys, and at least a head's width.
const UNITS: usize = 128;

/// The kernel, apart: cubecl's prelude has a `Tensor` of its own.
mod kernels {
    // Kernel code: cubecl's integers have no `div_ceil`.
    #![allow(clippy::manual_div_ceil)]
    use cubecl::prelude::*;

    use super::UNITS;

    /// Stand-in for −∞ (see the flash kernels' `LOWEST`): `exp` of the
    /// difference of two is 1, never NaN.
    const LOWEST: f32 = -1.0e30;

    #[cube(launch_unchecked)]
    pub(super) fn single_query_kernel<F: Float>(
        q: &Tensor<F>,
        k: &Tensor<F>,
        v: &Tensor<F>,
        out: &mut Tensor<F>,
        scale: f32,
        #[comptime] dim: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let heads = out.shape(1);
        let group = heads / k.shape(1);
        let seen = k.shape(2);
        let cube = CUBE_POS_X as usize;
        let (b, h) = (cube / heads, cube % heads);
        let unit = UNIT_POS as usize;
        let mut qs = SharedMemory::<f32>::new(dim);
        let mut chunk = SharedMemory::<f32>::new(UNITS);
        if unit < dim {
            let at = b * q.stride(0) + h * q.stride(1) + unit * q.stride(3);
            qs[unit] = f32::cast_from(q[at]) * scale;
        }
        sync_cube();
        let k_head = b * k.stride(0) + (h / group) * k.stride(1);
        let v_head = b * v.stride(0) + (h / group) * v.stride(1);
        let (k_row, k_col, v_row, v_col) = (k.stride(2), k.stride(3), v.stride(2), v.stride(3));
        // Units past the head's width read its last column and write nothing.
        let col = select(unit < dim, unit, dim - 1);
        let (mut max, mut sum, mut acc) = (f32::new(LOWEST), f32::new(0.0), f32::new(0.0));
        let chunks = (seen + UNITS - 1) / UNITS;
        for c in 0..chunks {
            let first = c * UNITS;
            let key = first + unit;
            let inside = key < seen;
            let row = k_head + select(inside, key, seen - 1) * k_row;
            let mut score = f32::new(0.0);
            #[unroll]
            for e in 0..dim {
                score += qs[e] * f32::cast_from(k[row + e * k_col]);
            }
            score = select(inside, score, f32::new(LOWEST));
            chunk[unit] = score;
            sync_cube();
            let mut new_max = max;
            for i in 0..UNITS {
                let s = chunk[i];
                if s > new_max {
                    new_max = s;
                }
            }
            sync_cube();
            chunk[unit] = select(inside, (score - new_max).exp(), f32::new(0.0));
            sync_cube();
            let alpha = (max - new_max).exp();
            sum *= alpha;
            acc *= alpha;
            let mut count = seen - first;
            if count > UNITS {
                count = UNITS;
            }
            for i in 0..count {
                let p = chunk[i];
                sum += p;
                acc += p * f32::cast_from(v[v_head + (first + i) * v_row + col * v_col]);
            }
            max = new_max;
            sync_cube();
        }
        if unit < dim {
            out[cube * dim + unit] = F::cast_from(acc / sum);
        }
    }
}
use kernels::single_query_kernel;

/// The kernel's output `[batch, heads, 1, d]`, contiguous; `None` off CUDA,
/// for mixed dtypes, or heads wider than a cube's units.
pub(super) fn single_query<B: Backend>(
    q: &Tensor<B, 4>,
    keys: &Tensor<B, 4>,
    values: &Tensor<B, 4>,
) -> Option<Tensor<B, 4>> {
    let [batch, heads, _, dim] = q.dims();
    let dtype = q.dtype();
    if !is_float(dtype) || keys.dtype() != dtype || values.dtype() != dtype || dim > UNITS {
        return None;
    }
    let (qc, kc, vc) = (float_cube(q)?, float_cube(keys)?, float_cube(values)?);
    let out = empty_like(&qc, &[batch, heads, 1, dim], dtype);
    if batch * heads > 0 && dim > 0 {
        // SAFETY: every index is in bounds by construction: keys past the
        // end are clamped to the last, and only the head's columns are
        // written.
        unsafe {
            single_query_kernel::launch_unchecked::<CudaRuntime>(
                &qc.client,
                CubeCount::Static((batch * heads) as u32, 1, 1),
                CubeDim::new_1d(UNITS as u32),
                qc.clone().into_tensor_arg(),
                kc.into_tensor_arg(),
                vc.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                1.0 / (dim as f32).sqrt(),
                dim,
                dtype.into(),
            );
        }
    }
    Some(as_float(out))
}
