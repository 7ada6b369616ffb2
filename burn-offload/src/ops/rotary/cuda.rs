//! [`crate::rotary`]'s rotation as one CubeCL kernel on burn's CUDA backend:
//! a unit per pair `(j, j + half)` of a head's row writes both rotated
//! values, f32 inside. `x` is read through its strides (the heads arrive as a
//! swapped view of the projection's output); the output is contiguous
//! `[batch, heads, seq, head_dim]`, as burn's elementwise ops write it.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use cubecl::{CubeCount, CubeDim};

use crate::cuda::{as_float, float_cube, is_float};
use crate::precision::cast_to;

/// The kernels, apart: cubecl's prelude has a `Tensor` of its own.
mod kernels {
    use cubecl::prelude::*;

    #[cube(launch)]
    pub(super) fn rotary_kernel<F: Float>(
        x: &Tensor<F>,
        cos: &Tensor<f32>,
        sin: &Tensor<f32>,
        out: &mut Tensor<F>,
        rows: u32,
        transpose: u32,
        #[define(F)] _dtype: StorageType,
    ) {
        // Row `row` of the `[b, h, s]` rows; lane `j` of the first half.
        let row = CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y;
        if row >= rows {
            terminate!();
        }
        let seq = out.shape(2) as u32;
        let heads = out.shape(1) as u32;
        let t = row % seq;
        let h = (row / seq) % heads;
        let b = row / (seq * heads);
        let j = UNIT_POS_X as usize;
        let half = CUBE_DIM_X as usize;
        let base = b as usize * x.stride(0) + h as usize * x.stride(1) + t as usize * x.stride(2);
        let a = f32::cast_from(x[base + j * x.stride(3)]);
        let c = f32::cast_from(x[base + (j + half) * x.stride(3)]);
        let (t, cs, ss) = (t as usize, cos.stride(1), sin.stride(1));
        let cos_a = cos[t * cos.stride(0) + j * cs];
        let sin_a = sin[t * sin.stride(0) + j * ss];
        let cos_c = cos[t * cos.stride(0) + (j + half) * cs];
        let sin_c = sin[t * sin.stride(0) + (j + half) * ss];
        let at = row as usize * 2 * half + j;
        if transpose == 0 {
            out[at] = F::cast_from(a * cos_a - c * sin_a);
            out[at + half] = F::cast_from(c * cos_c + a * sin_c);
        } else {
            out[at] = F::cast_from(a * cos_a + c * sin_c);
            out[at + half] = F::cast_from(c * cos_c - a * sin_a);
        }
    }
}
use kernels::rotary_kernel;

/// Units per cube at least (whole rows of pairs per cube).
const UNITS: usize = 256;

/// `x·cos + rotate_half(x)·sin`, or where `transpose` the transpose of that
/// map applied to `x`; `None` off CUDA or where a head's half is wider than a
/// cube.
pub(crate) fn rotate<B: Backend>(
    x: &Tensor<B, 4>,
    cos: &Tensor<B, 2>,
    sin: &Tensor<B, 2>,
    transpose: bool,
) -> Option<Tensor<B, 4>> {
    let xc = float_cube(x)?;
    let [batch, heads, seq, head_dim] = x.dims();
    let half = head_dim / 2;
    if !is_float(xc.dtype) || half > UNITS || !is_float(cos.dtype()) || !is_float(sin.dtype()) {
        return None;
    }
    let cos = float_cube(&cast_to(cos.clone(), DType::F32))?;
    let sin = float_cube(&cast_to(sin.clone(), DType::F32))?;
    let out = empty_device_contiguous_dtype(
        xc.client.clone(),
        xc.device.clone(),
        Shape::new([batch, heads, seq, head_dim]),
        xc.dtype,
    );
    let rows = batch * heads * seq;
    if rows > 0 && half > 0 {
        let rows_per_cube = (UNITS / half).max(1);
        rotary_kernel::launch::<CudaRuntime>(
            &xc.client,
            CubeCount::Static(rows.div_ceil(rows_per_cube) as u32, 1, 1),
            CubeDim::new_2d(half as u32, rows_per_cube as u32),
            xc.clone().into_tensor_arg(),
            cos.into_tensor_arg(),
            sin.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            rows as u32,
            u32::from(transpose),
            xc.dtype.into(),
        );
    }
    Some(as_float(out))
}
