//! [`crate::swiglu`]'s two passes as CubeCL kernels on burn's CUDA backend: a
//! unit per element, f32 inside, the inputs made contiguous first (no copy
//! when they are, as the projections' outputs are).

use burn::tensor::backend::Backend;
use burn::tensor::{Shape, Tensor};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, CubeDim};

use crate::cuda::{as_float, float_cube, is_float};

/// The kernels, apart: cubecl's prelude has a `Tensor` of its own.
mod kernels {
    use cubecl::prelude::*;

    #[cube(launch)]
    pub(super) fn swiglu_kernel<F: Float>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        out: &mut Tensor<F>,
        #[define(F)] _dtype: StorageType,
    ) {
        let i = ABSOLUTE_POS;
        if i >= out.len() {
            terminate!();
        }
        let g = f32::cast_from(gate[i]);
        let s = f32::new(1.0) / (f32::new(1.0) + (-g).exp());
        out[i] = F::cast_from(g * s * f32::cast_from(up[i]));
    }

    #[cube(launch)]
    pub(super) fn swiglu_grad_kernel<F: Float>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        grad: &Tensor<F>,
        dgate: &mut Tensor<F>,
        dup: &mut Tensor<F>,
        #[define(F)] _dtype: StorageType,
    ) {
        let i = ABSOLUTE_POS;
        if i >= dgate.len() {
            terminate!();
        }
        let g = f32::cast_from(gate[i]);
        let d = f32::cast_from(grad[i]);
        let s = f32::new(1.0) / (f32::new(1.0) + (-g).exp());
        let one = f32::new(1.0);
        dgate[i] = F::cast_from(d * f32::cast_from(up[i]) * s * (one + g * (one - s)));
        dup[i] = F::cast_from(d * g * s);
    }
}
use kernels::{swiglu_grad_kernel, swiglu_kernel};

const UNITS: u32 = 256;

/// The CUDA tensors of `ts`, contiguous, when all are of one float dtype and shape.
fn operands<B: Backend, const D: usize, const N: usize>(
    ts: [&Tensor<B, D>; N],
) -> Option<[CubeTensor<CudaRuntime>; N]> {
    let mut out = Vec::with_capacity(N);
    for t in ts {
        out.push(float_cube(t)?);
    }
    let first = &out[0];
    if !is_float(first.dtype)
        || out
            .iter()
            .any(|t| t.dtype != first.dtype || t.meta.shape() != first.meta.shape())
    {
        return None;
    }
    let out: Vec<_> = out.into_iter().map(into_contiguous).collect();
    out.try_into().ok()
}

fn empty_like(t: &CubeTensor<CudaRuntime>) -> CubeTensor<CudaRuntime> {
    empty_device_contiguous_dtype(
        t.client.clone(),
        t.device.clone(),
        Shape::from(t.meta.shape().to_vec()),
        t.dtype,
    )
}

/// `silu(gate) ⊙ up`; `None` off CUDA.
pub(crate) fn forward<B: Backend, const D: usize>(
    gate: &Tensor<B, D>,
    up: &Tensor<B, D>,
) -> Option<Tensor<B, D>> {
    let [gate, up] = operands([gate, up])?;
    let out = empty_like(&gate);
    let elements = gate.meta.shape().num_elements();
    if elements > 0 {
        let cube_dim = CubeDim::new_1d(UNITS);
        swiglu_kernel::launch::<CudaRuntime>(
            &gate.client,
            calculate_cube_count_elemwise(&gate.client, elements, cube_dim),
            cube_dim,
            gate.clone().into_tensor_arg(),
            up.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            gate.dtype.into(),
        );
    }
    Some(as_float(out))
}

/// `(d gate, d up)`; `None` off CUDA.
pub(crate) fn backward<B: Backend, const D: usize>(
    gate: &Tensor<B, D>,
    up: &Tensor<B, D>,
    grad: &Tensor<B, D>,
) -> Option<(Tensor<B, D>, Tensor<B, D>)> {
    let [gate, up, grad] = operands([gate, up, grad])?;
    let (dgate, dup) = (empty_like(&gate), empty_like(&gate));
    let elements = gate.meta.shape().num_elements();
    if elements > 0 {
        let cube_dim = CubeDim::new_1d(UNITS);
        swiglu_grad_kernel::launch::<CudaRuntime>(
            &gate.client,
            calculate_cube_count_elemwise(&gate.client, elements, cube_dim),
            cube_dim,
            gate.clone().into_tensor_arg(),
            up.into_tensor_arg(),
            grad.into_tensor_arg(),
            dgate.clone().into_tensor_arg(),
            dup.clone().into_tensor_arg(),
            gate.dtype.into(),
        );
    }
    Some((as_float(dgate), as_float(dup)))
}
