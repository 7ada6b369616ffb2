//! The `Offload<B>` methods that are not plain forwarding: creation and
//! read-back of host-resident tensors, require-grad bookkeeping that must not
//! page a parameter in, and signatures the forwarding macro cannot express.

use burn::tensor::backend::{Backend, ExecutionError};
use burn::tensor::ops::*;
use burn::tensor::quantization::{QuantScheme, QuantizationParametersPrimitive};
use burn::tensor::{
    BoolDType, Device, Distribution, FloatDType, IndexingUpdateOp, IntDType, Scalar, Shape, Slice,
    TensorData,
};
use std::future::Future;
use std::ops::Range;

use super::draw::random_data;
use super::offload::{Fill, Link};
use super::{lower, read_to_host, HostTensor, OffloadTensor, OffloadWith};
use crate::transfer::Transfer;

fn host<B: Backend, T: Transfer>(data: TensorData, device: &B::Device) -> OffloadTensor<B> {
    OffloadTensor::Host(HostTensor::new(data, device, Link::of::<T>()))
}

fn filled<B: Backend, T: Transfer>(
    shape: Shape,
    value: Scalar,
    device: &B::Device,
    dtype: FloatDType,
) -> OffloadTensor<B> {
    let fill = Fill {
        value,
        shape,
        dtype,
    };
    OffloadTensor::Host(HostTensor::filled(fill, device, Link::of::<T>()))
}

impl<B: Backend, T: Transfer> FloatTensorOps<Self> for OffloadWith<B, T> {
    forwarded_float_tensor_ops!();

    fn float_from_data(data: TensorData, device: &Device<Self>) -> FloatTensor<Self> {
        host::<B, T>(data, device)
    }

    fn float_random(
        shape: Shape,
        distribution: Distribution,
        device: &Device<Self>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        host::<B, T>(random_data(shape, distribution, dtype), device)
    }

    fn float_zeros(shape: Shape, device: &Device<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        filled::<B, T>(shape, Scalar::Float(0.0), device, dtype)
    }

    fn float_ones(shape: Shape, device: &Device<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        filled::<B, T>(shape, Scalar::Float(1.0), device, dtype)
    }

    fn float_full(
        shape: Shape,
        fill_value: Scalar,
        device: &Device<Self>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        filled::<B, T>(shape, fill_value, device, dtype)
    }

    fn float_empty(shape: Shape, device: &Device<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        Self::float_zeros(shape, device, dtype)
    }

    // Spelled as the trait declares it, so the `Send` bound stays visible.
    #[allow(clippy::manual_async_fn)]
    fn float_into_data(
        tensor: FloatTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        async move {
            match tensor {
                OffloadTensor::Host(h) => Ok((*h.data()).clone()),
                OffloadTensor::Device(t) => B::float_into_data(t.into_inner()).await,
            }
        }
    }

    fn float_device(tensor: &FloatTensor<Self>) -> Device<Self> {
        match tensor {
            OffloadTensor::Host(h) => h.device.clone(),
            OffloadTensor::Device(t) => B::float_device(t.tensor()),
        }
    }

    /// Moving a tensor to the `Offload` device parks it in host memory.
    fn float_to_device(tensor: FloatTensor<Self>, device: &Device<Self>) -> FloatTensor<Self> {
        match tensor {
            OffloadTensor::Host(h) if h.device == *device => OffloadTensor::Host(h),
            OffloadTensor::Host(h) => host::<B, T>((*h.data()).clone(), device),
            OffloadTensor::Device(t) => read_to_host::<B, T>(t.into_inner(), device),
        }
    }

    fn float_detach(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        match tensor {
            OffloadTensor::Device(t) => OffloadTensor::device(B::float_detach(t.into_inner())),
            host => host,
        }
    }

    fn float_set_require_grad(tensor: FloatTensor<Self>, require_grad: bool) -> FloatTensor<Self> {
        match tensor {
            OffloadTensor::Device(t) => {
                OffloadTensor::device(B::float_set_require_grad(t.into_inner(), require_grad))
            }
            host => host,
        }
    }

    fn float_is_require_grad(tensor: &FloatTensor<Self>) -> bool {
        match tensor {
            OffloadTensor::Device(t) => B::float_is_require_grad(t.tensor()),
            OffloadTensor::Host(_) => false,
        }
    }
}

impl<B: Backend, T: Transfer> IntTensorOps<Self> for OffloadWith<B, T> {
    forwarded_int_tensor_ops!();

    fn int_into_data(
        tensor: IntTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        B::int_into_data(tensor)
    }
}

impl<B: Backend, T: Transfer> BoolTensorOps<Self> for OffloadWith<B, T> {
    forwarded_bool_tensor_ops!();

    fn bool_into_data(
        tensor: BoolTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        B::bool_into_data(tensor)
    }
}

impl<B: Backend, T: Transfer> ModuleOps<Self> for OffloadWith<B, T> {
    forwarded_module_ops!();

    fn deform_conv2d_backward(
        x: FloatTensor<Self>,
        offset: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mask: Option<FloatTensor<Self>>,
        bias: Option<FloatTensor<Self>>,
        output_grad: FloatTensor<Self>,
        options: DeformConvOptions<2>,
    ) -> DeformConv2dBackward<Self> {
        let g = B::deform_conv2d_backward(
            lower(x),
            lower(offset),
            lower(weight),
            mask.map(lower),
            bias.map(lower),
            lower(output_grad),
            options,
        );
        DeformConv2dBackward::new(
            OffloadTensor::device(g.x_grad),
            OffloadTensor::device(g.offset_grad),
            OffloadTensor::device(g.weight_grad),
            g.mask_grad.map(OffloadTensor::device),
            g.bias_grad.map(OffloadTensor::device),
        )
    }

    fn max_pool2d_with_indices(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> MaxPool2dWithIndices<Self> {
        let r =
            B::max_pool2d_with_indices(lower(x), kernel_size, stride, padding, dilation, ceil_mode);
        MaxPool2dWithIndices::new(OffloadTensor::device(r.output), r.indices)
    }

    #[allow(clippy::too_many_arguments)]
    fn max_pool2d_with_indices_backward(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
        output_grad: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> MaxPool2dBackward<Self> {
        let r = B::max_pool2d_with_indices_backward(
            lower(x),
            kernel_size,
            stride,
            padding,
            dilation,
            ceil_mode,
            lower(output_grad),
            indices,
        );
        MaxPool2dBackward::new(OffloadTensor::device(r.x_grad))
    }

    fn rfft(
        signal: FloatTensor<Self>,
        dim: usize,
        n: Option<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (re, im) = B::rfft(lower(signal), dim, n);
        (OffloadTensor::device(re), OffloadTensor::device(im))
    }
}

impl<B: Backend, T: Transfer> ActivationOps<Self> for OffloadWith<B, T> {
    forwarded_activation_ops!();
}

impl<B: Backend, T: Transfer> QTensorOps<Self> for OffloadWith<B, T> {
    forwarded_q_tensor_ops!();

    fn quantize(
        tensor: FloatTensor<Self>,
        scheme: &QuantScheme,
        qparams: QuantizationParametersPrimitive<Self>,
    ) -> QuantizedTensor<Self> {
        let qparams = QuantizationParametersPrimitive {
            scales: lower(qparams.scales),
        };
        B::quantize(lower(tensor), scheme, qparams)
    }

    fn q_into_data(
        tensor: QuantizedTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        B::q_into_data(tensor)
    }
}

impl<B: Backend, T: Transfer> TransactionOps<Self> for OffloadWith<B, T> {}
