use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Flex};
use burn::tensor::activation::{sigmoid, silu};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::ops::record::{backward_each, cast, record, same, with_custom_backward};

/// `silu(gate) ⊙ up`, for tensors of one shape and dtype.
///
/// # Panics
/// If the shapes differ.
pub fn swiglu<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    assert_eq!(
        gate.dims(),
        up.dims(),
        "swiglu: gate and up differ in shape"
    );
    macro_rules! tracked_on {
        ($inner:ty) => {
            if same::<B, Autodiff<$inner>>() {
                return cast(tracked::<$inner, D>(cast(gate), cast(up)));
            }
        };
    }
    with_custom_backward!(tracked_on);
    if B::ad_enabled(&gate.device()) {
        silu(gate) * up
    } else {
        forward(gate, up)
    }
}

fn forward<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(feature = "cuda")]
    if let Some(out) = super::cuda::forward(&gate, &up) {
        return out;
    }
    silu(gate) * up
}

/// `(d gate, d up)` for the output gradient `grad` (one kernel on CUDA), on
/// a backend without autodiff.
pub(crate) fn swiglu_backward<B: Backend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
    grad: Tensor<B, D>,
) -> (Tensor<B, D>, Tensor<B, D>) {
    #[cfg(feature = "cuda")]
    if let Some(grads) = super::cuda::backward(&gate, &up, &grad) {
        return grads;
    }
    let s = sigmoid(gate.clone());
    let silu = gate.clone() * s.clone();
    let dsilu = s.clone() * (gate * (s.neg() + 1.0) + 1.0);
    ((grad.clone() * up) * dsilu, grad * silu)
}

#[derive(Debug)]
struct SwiGlu<const D: usize>;

impl<B: Backend, const D: usize> Backward<B, 2> for SwiGlu<D> {
    /// `gate` and `up`.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_each::<B, _, 2>(ops, grads, |(gate, up), grad| {
            let tensor = |t| Tensor::<B, D>::from_primitive(TensorPrimitive::Float(t));
            let (dgate, dup) = swiglu_backward(tensor(gate), tensor(up), tensor(grad));
            [dgate, dup].map(|g| g.into_primitive().tensor())
        });
    }
}

/// [`swiglu`] on `Autodiff<B>` as one operation.
fn tracked<B: Backend, const D: usize>(
    gate: Tensor<Autodiff<B>, D>,
    up: Tensor<Autodiff<B>, D>,
) -> Tensor<Autodiff<B>, D> {
    let (gate, up) = (gate.into_primitive().tensor(), up.into_primitive().tensor());
    let inner =
        |t: &FloatTensor<B>| Tensor::<B, D>::from_primitive(TensorPrimitive::Float(t.clone()));
    let result = forward(inner(&gate.primitive), inner(&up.primitive))
        .into_primitive()
        .tensor();
    let out = record(SwiGlu::<D>, [gate, up], result, |[gate, up]| (gate, up));
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{DType, Distribution};

    type A = Autodiff<Flex>;

    #[test]
    fn fused_swiglu_matches_burns_silu_times_up() {
        let device = Default::default();
        let random = || Tensor::<A, 3>::random([2, 5, 7], Distribution::Normal(0.0, 3.0), &device);
        let (gate, up, upstream) = (random(), random(), random().detach());
        let run = |fused: bool| {
            let (g, u) = (gate.clone().require_grad(), up.clone().require_grad());
            let out = if fused {
                swiglu(g.clone(), u.clone())
            } else {
                silu(g.clone()) * u.clone()
            };
            let grads = (out.clone() * upstream.clone()).sum().backward();
            [
                out.inner(),
                g.grad(&grads).expect("used"),
                u.grad(&grads).expect("used"),
            ]
        };
        for (name, (a, b)) in ["out", "dgate", "dup"]
            .iter()
            .zip(run(true).into_iter().zip(run(false)))
        {
            assert_eq!(a.dtype(), DType::F32);
            let err: f32 = (a - b).abs().max().into_scalar();
            assert!(err < 1e-4, "{name} off by {err}");
        }
    }
}
