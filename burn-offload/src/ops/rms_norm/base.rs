use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};

use crate::ops::record::{backward_each, cast, record, same, with_custom_backward};
use crate::precision::cast_to;

/// `x / sqrt(mean(x²) + epsilon) ⊙ gamma` over `x`'s last dimension, in
/// `x`'s dtype (computed in f32); `gamma` may be of another float dtype.
///
/// # Panics
/// If `gamma`'s length is not `x`'s last dimension.
pub fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    epsilon: f64,
) -> Tensor<B, D> {
    assert_eq!(
        gamma.dims()[0],
        x.dims()[D - 1],
        "rms_norm: gamma's length is not the last dimension of {:?}",
        x.dims()
    );
    macro_rules! tracked_on {
        ($inner:ty) => {
            if same::<B, Autodiff<$inner>>() {
                return cast(tracked::<$inner, D>(cast(x), cast(gamma), epsilon));
            }
        };
    }
    with_custom_backward!(tracked_on);
    forward(x, gamma, epsilon).0
}

/// The normalised `x` and each row's `r = 1/sqrt(mean(x²) + ε)`, f32 with
/// `x`'s shape but a last dimension of 1.
fn forward<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    epsilon: f64,
) -> (Tensor<B, D>, Tensor<B, D>) {
    #[cfg(feature = "cuda")]
    if let Some(out) = super::cuda::forward(&x, &gamma, epsilon) {
        return out;
    }
    let dtype = x.dtype();
    let x = cast_to(x, DType::F32);
    let r = (x.clone().square().mean_dim(D - 1) + epsilon)
        .sqrt()
        .recip();
    let y = x * r.clone() * cast_to(gamma, DType::F32).unsqueeze();
    (cast_to(y, dtype), r)
}

/// `(dx, dγ)` for the output gradient `grad`, in the dtypes of `x` and `γ`.
fn backward<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    r: Tensor<B, D>,
    grad: Tensor<B, D>,
) -> (Tensor<B, D>, Tensor<B, 1>) {
    #[cfg(feature = "cuda")]
    if let Some(grads) = super::cuda::backward(&x, &gamma, &r, &grad) {
        return grads;
    }
    let (dtype, gamma_dtype) = (x.dtype(), gamma.dtype());
    let width = x.dims()[D - 1];
    let rows = x.shape().num_elements() / width.max(1);
    let x_hat = cast_to(x, DType::F32) * r.clone();
    let grad = cast_to(grad, DType::F32);
    let g = grad.clone() * cast_to(gamma, DType::F32).unsqueeze();
    let mean = (g.clone() * x_hat.clone()).mean_dim(D - 1);
    let dx = (g - x_hat.clone() * mean) * r;
    let dgamma = (grad * x_hat)
        .reshape([rows, width])
        .sum_dim(0)
        .reshape([width]);
    (cast_to(dx, dtype), cast_to(dgamma, gamma_dtype))
}

#[derive(Debug)]
struct RmsNorm<const D: usize>;

impl<B: Backend, const D: usize> Backward<B, 2> for RmsNorm<D> {
    /// `x`, `γ` and `r`.
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_each::<B, _, 2>(ops, grads, |(x, gamma, r), grad| {
            let tensor = |t| Tensor::<B, D>::from_primitive(TensorPrimitive::Float(t));
            let gamma = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(gamma));
            let (dx, dgamma) = backward(tensor(x), gamma, tensor(r), tensor(grad));
            [
                dx.into_primitive().tensor(),
                dgamma.into_primitive().tensor(),
            ]
        });
    }
}

/// [`rms_norm`] on `Autodiff<B>` as one operation.
fn tracked<B: Backend, const D: usize>(
    x: Tensor<Autodiff<B>, D>,
    gamma: Tensor<Autodiff<B>, 1>,
    epsilon: f64,
) -> Tensor<Autodiff<B>, D> {
    let (x, gamma) = (x.into_primitive().tensor(), gamma.into_primitive().tensor());
    let (y, r) = forward(
        Tensor::<B, D>::from_primitive(TensorPrimitive::Float(x.primitive.clone())),
        Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(gamma.primitive.clone())),
        epsilon,
    );
    let y = y.into_primitive().tensor();
    let out = record(RmsNorm::<D>, [x, gamma], y, |[x, gamma]| {
        (x, gamma, r.into_primitive().tensor())
    });
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Param;
    use burn::nn::RmsNormConfig;
    use burn::tensor::Distribution;

    type A = Autodiff<Flex>;

    #[test]
    fn fused_rms_norm_matches_burns_rms_norm() {
        let device = Default::default();
        let x = Tensor::<A, 3>::random([2, 5, 8], Distribution::Normal(0.0, 3.0), &device);
        let upstream = Tensor::<A, 3>::random([2, 5, 8], Distribution::Normal(0.0, 1.0), &device);
        let mut norm = RmsNormConfig::new(8).with_epsilon(1e-5).init::<A>(&device);
        norm.gamma =
            Param::from_tensor(Tensor::random([8], Distribution::Normal(1.0, 0.5), &device));
        let run = |fused: bool| {
            let x = x.clone().require_grad();
            let out = if fused {
                rms_norm(x.clone(), norm.gamma.val(), norm.epsilon)
            } else {
                norm.forward(x.clone())
            };
            let grads = (out.clone() * upstream.clone()).sum().backward();
            [
                out.inner().reshape([80]),
                x.grad(&grads).expect("used").reshape([80]),
                norm.gamma.grad(&grads).expect("used"),
            ]
        };
        for (name, (a, b)) in ["out", "dx", "dgamma"]
            .iter()
            .zip(run(true).into_iter().zip(run(false)))
        {
            assert_eq!(a.dtype(), DType::F32);
            let err: f32 = (a - b).abs().max().into_scalar();
            assert!(err < 1e-4, "{name} off by {err}");
        }
    }
}
