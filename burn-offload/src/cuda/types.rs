//! Which burn backends are CUDA (burn's, `Gemm` over it, `Offload` over
//! either, `Autodiff` over those), and their tensors as cubecl's.

use std::any::{Any, TypeId};

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Shape, Tensor, TensorPrimitive};
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;

use crate::backend::{lower, Gemm, OffloadTensor};

/// `burn::backend::Cuda` in this workspace (fusion is off).
pub type CudaBackend = CubeBackend<CudaRuntime, f32, i32, u8>;

/// Whether `X` is the CUDA backend, `Gemm` over it (same tensors, its own
/// matmul), or `Autodiff` over either.
pub fn is_cuda<X: Backend>() -> bool {
    let x = TypeId::of::<X>();
    x == TypeId::of::<CudaBackend>()
        || x == TypeId::of::<Autodiff<CudaBackend>>()
        || x == TypeId::of::<Gemm<CudaBackend>>()
        || x == TypeId::of::<Autodiff<Gemm<CudaBackend>>>()
}

/// `device` as a CUDA device, where `X` is one of the CUDA backends
/// ([`is_cuda`]): what runs on [`CudaBackend`] whatever wraps it (autodiff,
/// the cuBLAS matmul) hands its output back as `X`'s.
pub(crate) fn cuda_device<X: Backend>(device: &X::Device) -> Option<&CudaDevice> {
    (device as &dyn Any)
        .downcast_ref::<CudaDevice>()
        .filter(|_| is_cuda::<X>())
}

/// A CUDA tensor as one of backend `X`, when `X` [`is_cuda`].
pub(super) fn cuda_as<X: Backend, const D: usize>(
    tensor: Tensor<CudaBackend, D>,
) -> Option<Tensor<X, D>> {
    let x = TypeId::of::<X>();
    let boxed: Box<dyn Any> = if x == TypeId::of::<CudaBackend>() {
        Box::new(tensor)
    } else if x == TypeId::of::<Autodiff<CudaBackend>>() {
        Box::new(Tensor::<Autodiff<CudaBackend>, D>::from_inner(tensor))
    } else if x == TypeId::of::<Gemm<CudaBackend>>() {
        Box::new(as_gemm(tensor))
    } else if x == TypeId::of::<Autodiff<Gemm<CudaBackend>>>() {
        Box::new(Tensor::<Autodiff<Gemm<CudaBackend>>, D>::from_inner(
            as_gemm(tensor),
        ))
    } else {
        return None;
    };
    boxed.downcast::<Tensor<X, D>>().ok().map(|t| *t)
}

/// The same tensor under `Gemm` (whose primitive is `CudaBackend`'s).
pub(super) fn as_gemm<const D: usize>(
    tensor: Tensor<CudaBackend, D>,
) -> Tensor<Gemm<CudaBackend>, D> {
    let TensorPrimitive::Float(t) = tensor.into_primitive() else {
        unreachable!("float tensors of the CUDA backend are not quantized here")
    };
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// A tensor of backend `X` as a CUDA one, when `X` is the CUDA backend or
/// `Gemm` over it (not `Autodiff`: read-backs take plain tensors).
pub(super) fn as_cuda<X: Backend, const D: usize>(
    tensor: Tensor<X, D>,
) -> Result<Tensor<CudaBackend, D>, Tensor<X, D>> {
    let x = TypeId::of::<X>();
    if x == TypeId::of::<CudaBackend>() {
        let boxed: Box<dyn Any> = Box::new(tensor);
        return Ok(*boxed.downcast().expect("checked type"));
    }
    if x == TypeId::of::<Gemm<CudaBackend>>() {
        let boxed: Box<dyn Any> = Box::new(tensor);
        let tensor: Tensor<Gemm<CudaBackend>, D> = *boxed.downcast().expect("checked type");
        let TensorPrimitive::Float(t) = tensor.into_primitive() else {
            unreachable!("float tensors of the CUDA backend are not quantized here")
        };
        return Ok(Tensor::from_primitive(TensorPrimitive::Float(t)));
    }
    Err(tensor)
}

/// `t`'s primitive as a CUDA tensor, for our own kernels: when `B`'s float
/// tensors are burn-cubecl's CUDA tensors (burn's CUDA backend, `Gemm` over
/// it), or `Offload` over either (paged in if host-resident).
pub(crate) fn float_cube<B: Backend, const D: usize>(
    t: &Tensor<B, D>,
) -> Option<CubeTensor<CudaRuntime>> {
    let primitive = t.clone().into_primitive();
    let TensorPrimitive::Float(p) = primitive else {
        return None;
    };
    let p = &p as &dyn Any;
    let cube = if let Some(c) = p.downcast_ref::<CubeTensor<CudaRuntime>>() {
        c.clone()
    } else if let Some(o) = p.downcast_ref::<OffloadTensor<CudaBackend>>() {
        lower(o.clone())
    } else if let Some(o) = p.downcast_ref::<OffloadTensor<Gemm<CudaBackend>>>() {
        lower(o.clone())
    } else {
        return None;
    };
    cube.qparams.is_none().then_some(cube)
}

pub(crate) fn int_cube<B: Backend, const D: usize>(
    t: &Tensor<B, D, Int>,
) -> Option<CubeTensor<CudaRuntime>> {
    let p = t.clone().into_primitive();
    (&p as &dyn Any)
        .downcast_ref::<CubeTensor<CudaRuntime>>()
        .cloned()
}

/// A CUDA tensor back as one of `B`, one that [`float_cube`] accepts.
pub(crate) fn as_float<B: Backend, const D: usize>(t: CubeTensor<CudaRuntime>) -> Tensor<B, D> {
    let x = TypeId::of::<B::FloatTensorPrimitive>();
    let boxed: Box<dyn Any> = if x == TypeId::of::<OffloadTensor<CudaBackend>>() {
        Box::new(OffloadTensor::<CudaBackend>::device(t))
    } else if x == TypeId::of::<OffloadTensor<Gemm<CudaBackend>>>() {
        Box::new(OffloadTensor::<Gemm<CudaBackend>>::device(t))
    } else {
        Box::new(t)
    };
    let p = *boxed
        .downcast::<B::FloatTensorPrimitive>()
        .unwrap_or_else(|_| unreachable!("checked by float_cube"));
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// A new contiguous tensor of `dims` and `dtype` on `like`'s device (its
/// values unset).
pub(crate) fn empty_like(
    like: &CubeTensor<CudaRuntime>,
    dims: &[usize],
    dtype: DType,
) -> CubeTensor<CudaRuntime> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(dims.to_vec()),
        dtype,
    )
}

/// The float dtypes our kernels read.
pub(crate) fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
}
