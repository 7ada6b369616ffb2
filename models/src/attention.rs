//! Causal softmax attention, written out in tensor ops.
//!
//! burn has no fused attention for autodiff backends, so every op below runs
//! on the `[batch, heads, seq, seq]` scores: at the 0.85B Llama's 16k tokens
//! one such tensor is 2 GiB in f32, and in the forward, the recompute and
//! the backward these passes rival the block's matmuls in GPU time. The
//! formulation keeps them few:
//!
//! - The scale goes on `q` (`[b, h, s, d]`, `s / d` times smaller), not on the
//!   scores.
//! - The max shift is detached, so the backward does not differentiate
//!   through it (burn's `module::attention` on an autodiff backend runs
//!   `attention_fallback`, whose shift is not detached).
//! - The weights are left unnormalised: `exp(scores − max)` multiplies `v`
//!   with a column of ones appended, so one matmul gives both `Σ_j e_ij v_j`
//!   and the row sum `Σ_j e_ij`, and the division happens on the `[b, h, s, d]`
//!   output. burn's `softmax` divides the scores themselves and sums them with
//!   `sum_dim`; autodiff then spends about 17 more score-sized passes per
//!   block in the backward (the division's two gradients, and `sum_dim`'s,
//!   which materialises a tensor of ones and broadcasts into it) and one
//!   more in each forward.

use burn::tensor::{backend::Backend, Bool, Tensor};

/// `softmax(q·kᵀ / √d + causal mask) · v` for `q, k, v: [batch, heads, seq, d]`
/// (`k` and `v` with as many heads as `q`).
pub fn causal_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let [batch, heads, seq, head_dim] = q.dims();
    let device = q.device();
    let q = q * (1.0 / (head_dim as f64).sqrt());
    let scores = q.matmul(k.swap_dims(2, 3));
    // `true` above the diagonal: position i attends to positions ≤ i. The
    // diagonal is never masked, so every row's max is finite and every row
    // sum is at least 1.
    let future = Tensor::<B, 2, Bool>::tril_mask([seq, seq], 0, &device)
        .unsqueeze::<4>()
        .expand([batch, heads, seq, seq]);
    let scores = scores.mask_fill(future, f32::NEG_INFINITY);
    let max = scores.clone().detach().max_dim(3);
    let weights = (scores - max).exp();
    // `[v | 1 | 0…]`: the ones column yields the row sums; the zero columns
    // pad the width to a multiple of 16 so the matmul keeps aligned tiles.
    let width = (head_dim + 1).next_multiple_of(16);
    let dtype = v.dtype();
    let ones = Tensor::<B, 4>::ones([batch, heads, seq, 1], (&device, dtype));
    let mut columns = vec![v, ones];
    if width > head_dim + 1 {
        let pad = [batch, heads, seq, width - head_dim - 1];
        columns.push(Tensor::zeros(pad, (&device, dtype)));
    }
    let summed = weights.matmul(Tensor::cat(columns, 3));
    let row_sums = summed.clone().narrow(3, head_dim, 1);
    summed.narrow(3, 0, head_dim) / row_sums
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

    /// Same values and gradients as burn's own causal attention: at unit
    /// scale, with scores in the thousands (where only the max shift keeps
    /// `exp` finite), and with a head width that needs no padding column.
    #[test]
    fn matches_burns_causal_attention() {
        let device = Default::default();
        for (shape, std) in [
            ([2, 3, 7, 8], 1.0),
            ([2, 3, 7, 8], 30.0),
            ([1, 2, 9, 15], 1.0),
        ] {
            let random = |std| {
                Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, std), &device)
                    .require_grad()
            };
            let (q, k, v) = (random(std), random(std), random(1.0));
            let weights = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);

            let ours = causal_attention(q.clone(), k.clone(), v.clone());
            let options = AttentionModuleOptions {
                is_causal: true,
                ..Default::default()
            };
            let burns = attention(q.clone(), k.clone(), v.clone(), None, None, options);
            let diff = max_abs_diff(ours.clone().inner(), burns.clone().inner());
            assert!(diff < 1e-5, "{shape:?} std {std}: values differ by {diff}");

            let ours_grads = (ours * weights.clone()).sum().backward();
            let burns_grads = (burns * weights).sum().backward();
            for t in [&q, &k, &v] {
                let diff = max_abs_diff(
                    t.grad(&ours_grads).expect("grad"),
                    t.grad(&burns_grads).expect("grad"),
                );
                assert!(
                    diff < 1e-4,
                    "{shape:?} std {std}: gradient differs by {diff}"
                );
            }
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
