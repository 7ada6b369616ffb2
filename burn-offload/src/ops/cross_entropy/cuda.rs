//! [`crate::cross_entropy`]'s two passes as CubeCL kernels on burn's CUDA
//! backend. Both read the logits in their own dtype and compute in f32:
//! - `nll_rows_kernel`: a cube per row finds the row's maximum, then the sum
//!   of `exp(x − max)` (two sweeps of the row, which stays in L2), and writes
//!   the log-sum-exp and `lse − x[target]`;
//! - `nll_grad_kernel`: a unit per logit writes
//!   `g[row] · (exp(x − lse[row]) − [col = target])` in the logits' dtype.
//!
//! A tensor of another backend (or a quantized one) is left to the tensor-op
//! path: the functions return `None`.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Shape, Tensor};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use cubecl::{calculate_cube_count_elemwise, CubeCount, CubeDim};

use crate::cuda::{as_float, float_cube, int_cube, is_float};

/// The kernels, apart: cubecl's prelude has a `Tensor` of its own.
mod kernels {
    use cubecl::prelude::*;

    /// Units per cube of the row kernel; its shared memory holds one value each.
    pub(super) const ROW_UNITS: u32 = 256;

    /// Tree reduction over the cube's `shared` values: maximum or sum.
    #[cube]
    fn reduce_shared(shared: &mut SharedMemory<f32>, unit: usize, #[comptime] max: bool) -> f32 {
        let mut half = CUBE_DIM_X as usize / 2;
        while half > 0 {
            if unit < half {
                let other = shared[unit + half];
                if max {
                    if other > shared[unit] {
                        shared[unit] = other;
                    }
                } else {
                    shared[unit] += other;
                }
            }
            sync_cube();
            half /= 2;
        }
        let result = shared[0];
        // Every unit has read the result before the memory is written again.
        sync_cube();
        result
    }

    #[cube(launch)]
    pub(super) fn nll_rows_kernel<F: Float, I: Numeric>(
        logits: &Tensor<F>,
        targets: &Tensor<I>,
        lse: &mut Tensor<f32>,
        nll: &mut Tensor<f32>,
        #[define(F, I)] _dtypes: [StorageType; 2],
    ) {
        let row = CUBE_POS_X as usize;
        let unit = UNIT_POS_X as usize;
        let units = CUBE_DIM_X as usize;
        let vocab = logits.shape(1);
        let base = row * logits.stride(0);
        let step = logits.stride(1);
        let mut shared = SharedMemory::<f32>::new(256usize);

        let mut local = f32::new(-3.0e38);
        let mut col = unit;
        while col < vocab {
            let x = f32::cast_from(logits[base + col * step]);
            if x > local {
                local = x;
            }
            col += units;
        }
        shared[unit] = local;
        sync_cube();
        let max = reduce_shared(&mut shared, unit, true);

        let mut local = f32::new(0.0);
        let mut col = unit;
        while col < vocab {
            local += (f32::cast_from(logits[base + col * step]) - max).exp();
            col += units;
        }
        shared[unit] = local;
        sync_cube();
        let sum = reduce_shared(&mut shared, unit, false);

        if unit == 0 {
            let row_lse = max + sum.ln();
            let target = u32::cast_from(targets[row * targets.stride(0)]) as usize;
            lse[row] = row_lse;
            nll[row] = row_lse - f32::cast_from(logits[base + target * step]);
        }
    }

    #[cube(launch)]
    pub(super) fn nll_grad_kernel<F: Float, I: Numeric>(
        logits: &Tensor<F>,
        targets: &Tensor<I>,
        lse: &Tensor<f32>,
        grad: &Tensor<f32>,
        out: &mut Tensor<F>,
        #[define(F, I)] _dtypes: [StorageType; 2],
    ) {
        let pos = ABSOLUTE_POS;
        if pos >= out.len() {
            terminate!();
        }
        let vocab = out.shape(1);
        let row = pos / vocab;
        let col = pos % vocab;
        let x = f32::cast_from(logits[row * logits.stride(0) + col * logits.stride(1)]);
        let mut d = (x - lse[row * lse.stride(0)]).exp();
        if col == u32::cast_from(targets[row * targets.stride(0)]) as usize {
            d -= f32::new(1.0);
        }
        out[pos] = F::cast_from(d * grad[row * grad.stride(0)]);
    }
}
use kernels::{nll_grad_kernel, nll_rows_kernel, ROW_UNITS};

/// `(nll, lse)` per row, f32 `[rows]`; `None` off CUDA.
pub(crate) fn forward<B: Backend>(
    logits: &Tensor<B, 2>,
    targets: &Tensor<B, 1, Int>,
) -> Option<(Tensor<B, 1>, Tensor<B, 1>)> {
    let (x, t) = (float_cube(logits)?, int_cube(targets)?);
    if !is_float(x.dtype) {
        return None;
    }
    let rows = x.meta.shape()[0];
    let new_rows = || {
        empty_device_contiguous_dtype(
            x.client.clone(),
            x.device.clone(),
            Shape::new([rows]),
            DType::F32,
        )
    };
    let (lse, nll) = (new_rows(), new_rows());
    if rows > 0 {
        nll_rows_kernel::launch::<CudaRuntime>(
            &x.client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(ROW_UNITS),
            x.clone().into_tensor_arg(),
            t.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            nll.clone().into_tensor_arg(),
            [x.dtype.into(), t.dtype.into()],
        );
    }
    Some((as_float(nll), as_float(lse)))
}

/// `grad[row] · (softmax − onehot)` in the logits' dtype; `None` off CUDA.
pub(crate) fn backward<B: Backend>(
    logits: &Tensor<B, 2>,
    targets: &Tensor<B, 1, Int>,
    lse: &Tensor<B, 1>,
    grad: &Tensor<B, 1>,
) -> Option<Tensor<B, 2>> {
    let (x, t) = (float_cube(logits)?, int_cube(targets)?);
    let (lse, grad) = (float_cube(lse)?, float_cube(grad)?);
    // The loss and so its upstream gradient are f32; the gradient may be a
    // broadcast view, which the kernel reads through its stride.
    if !is_float(x.dtype) || lse.dtype != DType::F32 || grad.dtype != DType::F32 {
        return None;
    }
    let out = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([x.meta.shape()[0], x.meta.shape()[1]]),
        x.dtype,
    );
    let elements = out.meta.shape().num_elements();
    if elements > 0 {
        let cube_dim = CubeDim::new_1d(256);
        nll_grad_kernel::launch::<CudaRuntime>(
            &x.client,
            calculate_cube_count_elemwise(&x.client, elements, cube_dim),
            cube_dim,
            x.clone().into_tensor_arg(),
            t.clone().into_tensor_arg(),
            lse.into_tensor_arg(),
            grad.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            [x.dtype.into(), t.dtype.into()],
        );
    }
    Some(as_float(out))
}
