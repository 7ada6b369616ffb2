//! Causal softmax attention, written out in tensor ops.
//!
//! burn's `module::attention` computes the same thing, but on an autodiff
//! backend it runs `attention_fallback`, whose softmax shifts by a max that is
//! *not* detached: the backward then differentiates through the shift (a
//! gradient that is zero) with a max-with-indices, a zero-filled score tensor
//! and a broadcast sum, and the scale multiplies the `[b, h, s, s]` scores in
//! the forward, the recompute and the backward. At the 0.85B Llama's 16k
//! tokens a score tensor is 2 GiB in f32, and those passes were about a fifth
//! of the GPU time of a step (Nsight Compute, bench/results/cuda-bench/run13).
//! Here the scale goes on `q` (`[b, h, s, d]`, `s / d` times smaller) and
//! burn's `softmax`, whose max shift is detached, does the rest.

use burn::tensor::activation::softmax;
use burn::tensor::{backend::Backend, Bool, Tensor};

/// `softmax(q·kᵀ / √d + causal mask) · v` for `q, k, v: [batch, heads, seq, d]`
/// (`k` and `v` with as many heads as `q`).
pub fn causal_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let [batch, heads, seq, head_dim] = q.dims();
    let q = q * (1.0 / (head_dim as f64).sqrt());
    let scores = q.matmul(k.swap_dims(2, 3));
    // `true` above the diagonal: position i attends to positions ≤ i. The
    // diagonal is never masked, so every row's max is finite.
    let future = Tensor::<B, 2, Bool>::tril_mask([seq, seq], 0, &scores.device())
        .unsqueeze::<4>()
        .expand([batch, heads, seq, seq]);
    let scores = scores.mask_fill(future, f32::NEG_INFINITY);
    softmax(scores, 3).matmul(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    use burn::tensor::Distribution;

    type B = Autodiff<Flex>;

    fn max_abs_diff<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>) -> f32 {
        (a - b).abs().max().into_scalar()
    }

    /// Same values and gradients as burn's own causal attention.
    #[test]
    fn matches_burns_causal_attention() {
        let device = Default::default();
        let shape = [2, 3, 7, 8];
        let random = || {
            Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device).require_grad()
        };
        let (q, k, v) = (random(), random(), random());
        let weights = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);

        let ours = causal_attention(q.clone(), k.clone(), v.clone());
        let options = AttentionModuleOptions {
            is_causal: true,
            ..Default::default()
        };
        let burns = attention(q.clone(), k.clone(), v.clone(), None, None, options);
        assert!(max_abs_diff(ours.clone().inner(), burns.clone().inner()) < 1e-5);

        let ours_grads = (ours * weights.clone()).sum().backward();
        let burns_grads = (burns * weights).sum().backward();
        for t in [&q, &k, &v] {
            let diff = max_abs_diff(
                t.grad(&ours_grads).expect("grad"),
                t.grad(&burns_grads).expect("grad"),
            );
            assert!(diff < 1e-4, "gradient differs by {diff}");
        }
    }

    /// A query never sees a later position: changing the last key and value
    /// leaves every earlier output as it was.
    #[test]
    fn is_causal() {
        let device = Default::default();
        let shape = [1, 2, 5, 4];
        let random = || Tensor::<Flex, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let (q, k, v) = (random(), random(), random());
        let before = causal_attention(q.clone(), k.clone(), v.clone());
        let bump = |t: Tensor<Flex, 4>| {
            t.clone().slice_assign(
                [0..1, 0..2, 4..5, 0..4],
                Tensor::ones([1, 2, 1, 4], &device) * 9.0,
            )
        };
        let after = causal_attention(q, bump(k), bump(v));
        let earlier = |t: Tensor<Flex, 4>| t.slice([0..1, 0..2, 0..4, 0..4]);
        assert!(max_abs_diff(earlier(before.clone()), earlier(after.clone())) < 1e-6);
        let last = |t: Tensor<Flex, 4>| t.slice([0..1, 0..2, 4..5, 0..4]);
        assert!(max_abs_diff(last(before), last(after)) > 1e-3);
    }
}
