//! The plumbing every custom autodiff operation of this crate shares: which
//! backends run them as one operation, and how one is recorded on burn's
//! autodiff graph (burn-autodiff's `ops/backward.rs` plays this part there).

use std::any::{Any, TypeId};

use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// Invokes `$each!(Inner)` for every inner backend whose `Autodiff` runs
/// `causal_attention` as one operation (the one list both
/// `causal_attention` and `has_custom_backward` read).
macro_rules! with_custom_backward {
    ($each:ident) => {
        $each!(burn::backend::Flex);
        $each!(crate::backend::Gemm<Flex>);
        $each!(crate::device::Offload<Flex>);
        $each!(crate::device::Offload<crate::backend::Gemm<Flex>>);
        #[cfg(feature = "cuda")]
        {
            $each!(crate::cuda::CudaBackend);
            $each!(crate::backend::Gemm<crate::cuda::CudaBackend>);
            $each!(crate::device::Offload<crate::cuda::CudaBackend>);
            $each!(crate::device::Offload<crate::backend::Gemm<crate::cuda::CudaBackend>>);
        }
    };
}
pub(crate) use with_custom_backward;

pub(crate) fn same<A: 'static, B: 'static>() -> bool {
    TypeId::of::<A>() == TypeId::of::<B>()
}

/// `t` as the type it is (checked by [`same`] before).
pub(crate) fn cast<T: 'static, U: 'static>(t: T) -> U {
    *(Box::new(t) as Box<dyn Any>)
        .downcast::<U>()
        .unwrap_or_else(|_| unreachable!("cast between different types"))
}

/// A float primitive as a tensor of rank `D`.
pub(crate) fn tensor<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// A float tensor's primitive.
pub(crate) fn float<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// Records `op` on the autodiff graph as one operation over `inputs`, with
/// `result` (computed by the caller on the inner backend) as its output.
/// Where some input is tracked, `state`, given the inputs' inner tensors,
/// builds what the backward keeps. The operations of this crate with a
/// backward of their own (attention, loss, SwiGLU, RMSNorm, rotary) all go
/// through here.
pub(crate) fn record<B: Backend, O: Backward<B, N>, const N: usize>(
    op: O,
    inputs: [FloatTensor<Autodiff<B>>; N],
    result: FloatTensor<B>,
    state: impl FnOnce([FloatTensor<B>; N]) -> O::State,
) -> FloatTensor<Autodiff<B>> {
    let nodes = inputs.each_ref().map(|t| t.node.clone());
    let inner = inputs.map(|t| t.primitive);
    match op
        .prepare::<NoCheckpointing>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state(inner), result),
        OpsKind::UnTracked(prep) => prep.finish(result),
    }
}

/// The body of an operation's backward: takes the output's gradient, runs
/// `backward` on the saved state and it, and hands each input its gradient
/// where that input is tracked.
pub(crate) fn backward_each<B: Backend, S, const N: usize>(
    ops: Ops<S, N>,
    grads: &mut Gradients,
    backward: impl FnOnce(S, FloatTensor<B>) -> [FloatTensor<B>; N],
) {
    let grad = grads.consume::<B>(&ops.node);
    let gradients = backward(ops.state, grad);
    for (parent, gradient) in ops.parents.into_iter().zip(gradients) {
        if let Some(node) = parent {
            grads.register::<B>(node.id, gradient);
        }
    }
}
