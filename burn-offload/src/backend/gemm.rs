//! `Gemm<B>`: backend `B` with its matmuls launched by a chosen kernel.
//!
//! Two thirds of the engine's GPU time is matmul (Nsight Compute, see
//! bench/results/cuda-bench), and burn 0.21 without autotune launches
//! every matmul of its CUDA backend with cubek's `Auto` strategy: 82–94 TFLOPS
//! in bf16 on the H100 where other cubek strategies reach 206–217 on the same
//! shapes. burn offers no hook to choose, so this decorator sits under
//! `Autodiff`: every operation goes straight to `B` (the tensor types *are*
//! `B`'s, so nothing is wrapped or copied), except `float_matmul` and the
//! `linear` ops, which on burn's CUDA backend launch the kernel chosen with
//! `set_matmul`. The
//! default, `auto`, is burn's own path: `Gemm<B>` then computes exactly what `B`
//! computes.

use std::future::Future;
use std::marker::PhantomData;

use burn::tensor::backend::{Backend, BackendTypes, DTypeUsageSet, ExecutionError};
use burn::tensor::ops::*;
use burn::tensor::quantization::{QuantScheme, QuantizationParametersPrimitive};
use burn::tensor::{
    BoolDType, DType, Device, Distribution, FloatDType, IndexingUpdateOp, IntDType, Scalar, Shape,
    Slice, TensorData, TensorMetadata,
};
use std::ops::Range;

/// The decorator: `Offload<Gemm<Cuda>>`, or `Gemm<Cuda>` under the engine.
pub struct Gemm<B>(PhantomData<B>);

impl<B> Clone for Gemm<B> {
    fn clone(&self) -> Self {
        Self(PhantomData)
    }
}
impl<B> Default for Gemm<B> {
    fn default() -> Self {
        Self(PhantomData)
    }
}
impl<B: Backend> std::fmt::Debug for Gemm<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gemm<{}>", std::any::type_name::<B>())
    }
}

/// The matmul kernels a backend offers `Gemm` over it: the one place that
/// says which backends have kernels of their own (burn's CUDA backend, in
/// `crate::cuda`). The defaults are burn's own matmul.
pub trait GemmKernels: Backend {
    /// `lhs @ rhs` with the selected kernel; the operands back where none is
    /// selected or it does not run this case.
    #[allow(clippy::type_complexity)]
    fn matmul(
        lhs: Self::FloatTensorPrimitive,
        rhs: Self::FloatTensorPrimitive,
    ) -> Result<Self::FloatTensorPrimitive, (Self::FloatTensorPrimitive, Self::FloatTensorPrimitive)>
    {
        Err((lhs, rhs))
    }

    /// Whether a kernel other than burn's is selected.
    fn kernel_chosen() -> bool {
        false
    }
}

impl GemmKernels for burn::backend::Flex {}

/// Why a matmul kernel cannot be selected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MatmulError {
    /// No kernel of that name.
    #[error("unknown matmul kernel `{name}`; one of: {}", known.join(", "))]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: Vec<String>,
    },
    /// A kernel of the CUDA build asked of a build without it.
    #[error(
        "matmul kernel `{0}` needs a build with `--features cuda`; this build has only `auto`"
    )]
    NeedsCuda(String),
    /// A cuBLAS kernel without libcublas on the library path.
    #[error(
        "matmul kernel `{0}`: libcublas was not found; put the directory holding libcublas.so \
         (CUDA 13; PyTorch's wheel ships one under site-packages/nvidia/cu13/lib) on LD_LIBRARY_PATH"
    )]
    NoCublas(String),
}

fn matmul<B: GemmKernels>(
    lhs: B::FloatTensorPrimitive,
    rhs: B::FloatTensorPrimitive,
) -> B::FloatTensorPrimitive {
    match B::matmul(lhs, rhs) {
        Ok(out) => out,
        Err((lhs, rhs)) => B::float_matmul(lhs, rhs),
    }
}

fn kernel_chosen<B: GemmKernels>() -> bool {
    B::kernel_chosen()
}

/// `[.., d]` as `[rows, d]`.
fn rows<B: Backend>(tensor: FloatTensor<B>) -> FloatTensor<B> {
    let shape = tensor.shape();
    let d = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / d.max(1);
    B::float_reshape(tensor, Shape::new([rows, d]))
}

/// `shape` with its last dim replaced by `last`.
fn with_last(shape: &Shape, last: usize) -> Shape {
    let mut dims = shape.to_vec();
    *dims.last_mut().expect("a linear input has a feature dim") = last;
    Shape::from(dims)
}

// burn's `Linear` does not call `float_matmul` of the backend under
// `Autodiff`: its forward and backward are module ops that `B` runs with its
// own matmul. With a kernel chosen they run here, as one matmul over all
// rows (`[b·s, d]`): that also spares the weight gradient burn's `[b, d_in,
// d_out]` batch of partial products and the sum over it. Under `auto` they
// are `B`'s, so that `Gemm<B>` computes exactly what `B` computes.
fn linear<B: GemmKernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    if !kernel_chosen::<B>() {
        return B::linear(x, weight, bias);
    }
    let shape = x.shape();
    let out = with_last(&shape, weight.shape()[1]);
    let y = B::float_reshape(matmul::<B>(rows::<B>(x), weight), out);
    match bias {
        Some(bias) => {
            let mut dims = vec![1; shape.num_dims() - 1];
            dims.push(bias.shape().num_elements());
            B::float_add(y, B::float_reshape(bias, Shape::from(dims)))
        }
        None => y,
    }
}

fn linear_x_backward<B: GemmKernels>(
    weight: FloatTensor<B>,
    output_grad: FloatTensor<B>,
) -> FloatTensor<B> {
    if !kernel_chosen::<B>() {
        return B::linear_x_backward(weight, output_grad);
    }
    let input = with_last(&output_grad.shape(), weight.shape()[0]);
    let grad = matmul::<B>(rows::<B>(output_grad), B::float_swap_dims(weight, 0, 1));
    B::float_reshape(grad, input)
}

fn linear_weight_backward<B: GemmKernels>(
    x: FloatTensor<B>,
    output_grad: FloatTensor<B>,
) -> FloatTensor<B> {
    if !kernel_chosen::<B>() {
        return B::linear_weight_backward(x, output_grad);
    }
    let x = B::float_swap_dims(rows::<B>(x), 0, 1);
    matmul::<B>(x, rows::<B>(output_grad))
}

// The op lists of `forwarded.rs`, each method a plain call of `B`'s: the
// operand tags only matter to `Offload`, since here the types are `B`'s.
macro_rules! forward_fns {
    ($(fn $name:ident($($k:ident $arg:ident : $ty:ty),* $(,)?) -> $rk:ident $ret:ty;)*) => {
        $(
            fn $name($($arg: $ty),*) -> $ret {
                gemm_call!($name, $($arg),*)
            }
        )*
    };
}

macro_rules! gemm_call {
    (float_matmul, $lhs:ident, $rhs:ident) => {
        matmul::<B>($lhs, $rhs)
    };
    (linear, $x:ident, $weight:ident, $bias:ident) => {
        linear::<B>($x, $weight, $bias)
    };
    (linear_x_backward, $weight:ident, $grad:ident) => {
        linear_x_backward::<B>($weight, $grad)
    };
    (linear_weight_backward, $x:ident, $grad:ident) => {
        linear_weight_backward::<B>($x, $grad)
    };
    ($name:ident, $($arg:ident),*) => {
        B::$name($($arg),*)
    };
}

impl<B: GemmKernels> BackendTypes for Gemm<B> {
    type Device = B::Device;
    type FloatTensorPrimitive = B::FloatTensorPrimitive;
    type FloatElem = B::FloatElem;
    type IntTensorPrimitive = B::IntTensorPrimitive;
    type IntElem = B::IntElem;
    type BoolTensorPrimitive = B::BoolTensorPrimitive;
    type BoolElem = B::BoolElem;
    type QuantizedTensorPrimitive = B::QuantizedTensorPrimitive;
}

impl<B: GemmKernels> Backend for Gemm<B> {
    fn name(device: &Self::Device) -> String {
        format!("gemm<{}>", B::name(device))
    }

    fn seed(device: &Self::Device, seed: u64) {
        B::seed(device, seed);
    }

    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        B::sync(device)
    }

    fn memory_cleanup(device: &Self::Device) {
        B::memory_cleanup(device)
    }

    fn dtype_usage(device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        B::device_count(type_id)
    }
}

impl<B: GemmKernels> FloatTensorOps<Self> for Gemm<B> {
    forwarded_float_tensor_ops!();

    fn float_from_data(data: TensorData, device: &Device<Self>) -> FloatTensor<Self> {
        B::float_from_data(data, device)
    }

    fn float_random(
        shape: Shape,
        distribution: Distribution,
        device: &Device<Self>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        B::float_random(shape, distribution, device, dtype)
    }

    fn float_zeros(shape: Shape, device: &Device<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        B::float_zeros(shape, device, dtype)
    }

    fn float_ones(shape: Shape, device: &Device<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        B::float_ones(shape, device, dtype)
    }

    fn float_full(
        shape: Shape,
        fill_value: Scalar,
        device: &Device<Self>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        B::float_full(shape, fill_value, device, dtype)
    }

    fn float_empty(shape: Shape, device: &Device<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        B::float_empty(shape, device, dtype)
    }

    fn float_into_data(
        tensor: FloatTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        B::float_into_data(tensor)
    }

    fn float_device(tensor: &FloatTensor<Self>) -> Device<Self> {
        B::float_device(tensor)
    }

    fn float_to_device(tensor: FloatTensor<Self>, device: &Device<Self>) -> FloatTensor<Self> {
        B::float_to_device(tensor, device)
    }

    fn float_detach(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        B::float_detach(tensor)
    }

    fn float_set_require_grad(tensor: FloatTensor<Self>, require_grad: bool) -> FloatTensor<Self> {
        B::float_set_require_grad(tensor, require_grad)
    }

    fn float_is_require_grad(tensor: &FloatTensor<Self>) -> bool {
        B::float_is_require_grad(tensor)
    }
}

impl<B: GemmKernels> IntTensorOps<Self> for Gemm<B> {
    forwarded_int_tensor_ops!();

    fn int_into_data(
        tensor: IntTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        B::int_into_data(tensor)
    }
}

impl<B: GemmKernels> BoolTensorOps<Self> for Gemm<B> {
    forwarded_bool_tensor_ops!();

    fn bool_into_data(
        tensor: BoolTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        B::bool_into_data(tensor)
    }
}

impl<B: GemmKernels> ModuleOps<Self> for Gemm<B> {
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
        let g = B::deform_conv2d_backward(x, offset, weight, mask, bias, output_grad, options);
        DeformConv2dBackward::new(
            g.x_grad,
            g.offset_grad,
            g.weight_grad,
            g.mask_grad,
            g.bias_grad,
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
        let r = B::max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode);
        MaxPool2dWithIndices::new(r.output, r.indices)
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
            x,
            kernel_size,
            stride,
            padding,
            dilation,
            ceil_mode,
            output_grad,
            indices,
        );
        MaxPool2dBackward::new(r.x_grad)
    }

    fn rfft(
        signal: FloatTensor<Self>,
        dim: usize,
        n: Option<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        B::rfft(signal, dim, n)
    }
}

impl<B: GemmKernels> ActivationOps<Self> for Gemm<B> {
    forwarded_activation_ops!();
}

impl<B: GemmKernels> QTensorOps<Self> for Gemm<B> {
    forwarded_q_tensor_ops!();

    fn quantize(
        tensor: FloatTensor<Self>,
        scheme: &QuantScheme,
        qparams: QuantizationParametersPrimitive<Self>,
    ) -> QuantizedTensor<Self> {
        let qparams = QuantizationParametersPrimitive {
            scales: qparams.scales,
        };
        B::quantize(tensor, scheme, qparams)
    }

    fn q_into_data(
        tensor: QuantizedTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        B::q_into_data(tensor)
    }
}

impl<B: GemmKernels> TransactionOps<Self> for Gemm<B> {}
