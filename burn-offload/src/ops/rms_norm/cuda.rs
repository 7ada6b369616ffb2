//! [`crate::rms_norm`]'s passes as CubeCL kernels on burn's CUDA backend, f32
//! inside, over `x` made contiguous and viewed as `[rows, width]`:
//! - `rms_norm_kernel` (forward): a plane per row sums the squares, then
//!   writes `x·r·γ` and the row's `r`;
//! - `rms_norm_grad_kernel` (backward, `dx`): a plane per row sums
//!   `dy ⊙ γ ⊙ x`, then writes `r·(dy ⊙ γ − x·r²·sum/width)`;
//! - `rms_norm_gamma_grad_kernel` (backward, `dγ`): a unit per column and
//!   chunk of `CHUNK_ROWS` rows sums `dy ⊙ x·r` down its chunk (adjacent
//!   units read adjacent columns); the chunks' sums are then added by burn.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{CubeCount, CubeDim};

use crate::cuda::{as_float, float_cube, is_float, plane_per_row};
use crate::precision::cast_to;

/// The kernels, apart: cubecl's prelude has a `Tensor` of its own.
mod kernels {
    use cubecl::prelude::*;

    #[cube(launch)]
    pub(super) fn rms_norm_kernel<F: Float>(
        x: &Tensor<F>,
        gamma: &Tensor<F>,
        out: &mut Tensor<F>,
        r: &mut Tensor<f32>,
        width: u32,
        epsilon: f32,
        #[define(F)] _dtype: StorageType,
    ) {
        let row = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
        if row >= r.len() {
            terminate!();
        }
        let lanes = CUBE_DIM_X as usize;
        let n = width as usize;
        let base = row * n;
        let mut sum = f32::new(0.0);
        let mut col = UNIT_POS_X as usize;
        while col < n {
            let v = f32::cast_from(x[base + col]);
            sum += v * v;
            col += lanes;
        }
        let sum = plane_sum(sum);
        let inverse = f32::new(1.0) / (sum / f32::cast_from(width) + epsilon).sqrt();
        let mut col = UNIT_POS_X as usize;
        while col < n {
            let v = f32::cast_from(x[base + col]) * inverse * f32::cast_from(gamma[col]);
            out[base + col] = F::cast_from(v);
            col += lanes;
        }
        if UNIT_POS_X == 0 {
            r[row] = inverse;
        }
    }

    #[cube(launch)]
    pub(super) fn rms_norm_grad_kernel<F: Float>(
        x: &Tensor<F>,
        gamma: &Tensor<F>,
        r: &Tensor<f32>,
        grad: &Tensor<F>,
        dx: &mut Tensor<F>,
        width: u32,
        #[define(F)] _dtype: StorageType,
    ) {
        let row = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
        if row >= r.len() {
            terminate!();
        }
        let lanes = CUBE_DIM_X as usize;
        let n = width as usize;
        let base = row * n;
        let mut sum = f32::new(0.0);
        let mut col = UNIT_POS_X as usize;
        while col < n {
            let g = f32::cast_from(grad[base + col]) * f32::cast_from(gamma[col]);
            sum += g * f32::cast_from(x[base + col]);
            col += lanes;
        }
        let sum = plane_sum(sum);
        let inverse = r[row];
        // r · x·r·Σ(g ⊙ x̂)/n with x̂ = x·r: the x-term's factor.
        let scale = inverse * inverse * inverse * sum / f32::cast_from(width);
        let mut col = UNIT_POS_X as usize;
        while col < n {
            let g = f32::cast_from(grad[base + col]) * f32::cast_from(gamma[col]);
            let v = inverse * g - scale * f32::cast_from(x[base + col]);
            dx[base + col] = F::cast_from(v);
            col += lanes;
        }
    }

    #[cube(launch)]
    pub(super) fn rms_norm_gamma_grad_kernel<F: Float>(
        x: &Tensor<F>,
        r: &Tensor<f32>,
        grad: &Tensor<F>,
        partial: &mut Tensor<f32>,
        width: u32,
        chunk_rows: u32,
        #[define(F)] _dtype: StorageType,
    ) {
        let col = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
        let n = width as usize;
        if col >= n {
            terminate!();
        }
        let chunk = CUBE_POS_Y as usize;
        let mut row = chunk * chunk_rows as usize;
        let mut end = row + chunk_rows as usize;
        if end > r.len() {
            end = r.len();
        }
        let mut sum = f32::new(0.0);
        while row < end {
            let at = row * n + col;
            sum += f32::cast_from(grad[at]) * f32::cast_from(x[at]) * r[row];
            row += 1;
        }
        partial[chunk * n + col] = sum;
    }
}
use kernels::{rms_norm_gamma_grad_kernel, rms_norm_grad_kernel, rms_norm_kernel};

/// Rows a unit of the `dγ` kernel sums.
const CHUNK_ROWS: usize = 256;
/// Units (columns) per cube of the `dγ` kernel.
const COLUMNS_PER_CUBE: u32 = 256;

/// `x` and `γ` as contiguous CUDA tensors of one float dtype (`γ` cast to
/// `x`'s: it is `width` values), with `x`'s rows and width.
struct Operands {
    x: CubeTensor<CudaRuntime>,
    gamma: CubeTensor<CudaRuntime>,
    rows: usize,
    width: usize,
}

fn operands<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    gamma: &Tensor<B, 1>,
) -> Option<Operands> {
    let xc = float_cube(x)?;
    if !is_float(xc.dtype) || !is_float(gamma.dtype()) {
        return None;
    }
    let gc = float_cube(&cast_to(gamma.clone(), xc.dtype))?;
    let width = x.dims()[D - 1];
    Some(Operands {
        rows: x.shape().num_elements() / width.max(1),
        width,
        x: into_contiguous(xc),
        gamma: into_contiguous(gc),
    })
}

/// `x`'s dims with the last one 1: the shape of `r`.
fn row_dims<const D: usize>(dims: [usize; D]) -> Shape {
    let mut dims = dims.to_vec();
    dims[D - 1] = 1;
    Shape::from(dims)
}

/// The normalised `x` and `r` (f32, `x`'s dims with the last one 1); `None`
/// off CUDA.
pub(crate) fn forward<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    gamma: &Tensor<B, 1>,
    epsilon: f64,
) -> Option<(Tensor<B, D>, Tensor<B, D>)> {
    let Operands {
        x: xc,
        gamma: gc,
        rows,
        width,
    } = operands(x, gamma)?;
    let out = empty_device_contiguous_dtype(
        xc.client.clone(),
        xc.device.clone(),
        Shape::from(x.dims().to_vec()),
        xc.dtype,
    );
    let r = empty_device_contiguous_dtype(
        xc.client.clone(),
        xc.device.clone(),
        row_dims(x.dims()),
        DType::F32,
    );
    if let Some((cubes, cube_dim)) = plane_per_row(rows, width) {
        rms_norm_kernel::launch::<CudaRuntime>(
            &xc.client,
            cubes,
            cube_dim,
            xc.clone().into_tensor_arg(),
            gc.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            r.clone().into_tensor_arg(),
            width as u32,
            epsilon as f32,
            xc.dtype.into(),
        );
    }
    Some((as_float(out), as_float(r)))
}

/// `(dx, dγ)` in the dtypes of `x` and `γ`; `None` off CUDA.
pub(crate) fn backward<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    gamma: &Tensor<B, 1>,
    r: &Tensor<B, D>,
    grad: &Tensor<B, D>,
) -> Option<(Tensor<B, D>, Tensor<B, 1>)> {
    let Operands {
        x: xc,
        gamma: gc,
        rows,
        width,
    } = operands(x, gamma)?;
    let (rc, dy) = (float_cube(r)?, float_cube(grad)?);
    if rc.dtype != DType::F32 || dy.dtype != xc.dtype || grad.dims() != x.dims() {
        return None;
    }
    let (rc, dy) = (into_contiguous(rc), into_contiguous(dy));
    let new = |dims: Shape, dtype| {
        empty_device_contiguous_dtype(xc.client.clone(), xc.device.clone(), dims, dtype)
    };
    let dx = new(Shape::from(x.dims().to_vec()), xc.dtype);
    let chunks = rows.div_ceil(CHUNK_ROWS).max(1);
    let partial = new(Shape::new([chunks, width]), DType::F32);
    if let Some((cubes, cube_dim)) = plane_per_row(rows, width) {
        rms_norm_grad_kernel::launch::<CudaRuntime>(
            &xc.client,
            cubes,
            cube_dim,
            xc.clone().into_tensor_arg(),
            gc.into_tensor_arg(),
            rc.clone().into_tensor_arg(),
            dy.clone().into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            width as u32,
            xc.dtype.into(),
        );
        rms_norm_gamma_grad_kernel::launch::<CudaRuntime>(
            &xc.client,
            CubeCount::Static((width as u32).div_ceil(COLUMNS_PER_CUBE), chunks as u32, 1),
            CubeDim::new_1d(COLUMNS_PER_CUBE),
            xc.clone().into_tensor_arg(),
            rc.into_tensor_arg(),
            dy.into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            width as u32,
            CHUNK_ROWS as u32,
            xc.dtype.into(),
        );
    } else {
        // No rows: dγ is zero (the kernel would leave `partial` unwritten).
        let zeros = Tensor::<B, 1>::zeros([width], &x.device());
        return Some((as_float(dx), cast_to(zeros, gamma.dtype())));
    }
    let dgamma = as_float::<B, 2>(partial).sum_dim(0).reshape([width]);
    Some((as_float(dx), cast_to(dgamma, gamma.dtype())))
}
