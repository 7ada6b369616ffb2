use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Flex};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, IndexingUpdateOp, Int, Tensor, TensorPrimitive};

use crate::ops::record::{cast, record, same, with_custom_backward};
use crate::precision::cast_to;

/// `-log softmax(logits)[target]` per row, in f32, for `logits: [rows, vocab]`
/// (any float dtype) and `targets: [rows]`.
///
/// # Panics
/// If the shapes disagree.
pub fn nll_rows<B: Backend>(logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    check_shapes(&logits, &targets);
    macro_rules! tracked_on {
        ($inner:ty) => {
            if same::<B, Autodiff<$inner>>() {
                return cast(tracked::<$inner>(cast(logits), cast(targets)));
            }
        };
    }
    with_custom_backward!(tracked_on);
    if B::ad_enabled(&logits.device()) {
        reference_nll_rows(logits, targets)
    } else {
        nll_forward(logits, targets).0
    }
}

/// A target that takes no part in the loss (a prompt token, padding): any
/// negative target counts as ignored; this is the one the trainer writes (as
/// PyTorch's `ignore_index`).
pub const IGNORE_INDEX: i64 = -100;

/// The sum of [`nll_rows`] over `logits: [batch, seq, vocab]` and
/// `targets: [batch, seq]`, in f32, over the rows whose target is not
/// ignored (negative): those add nothing to the sum and get a zero gradient.
pub fn nll_sum<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    kept_rows_sum(logits, targets, nll_rows)
}

/// [`nll_sum`] in tensor ops ([`reference_nll_rows`]): the loss plain burn
/// differentiates op by op, the oracle of the engine's tests.
pub fn reference_nll_sum<B: Backend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
) -> Tensor<B, 1> {
    kept_rows_sum(logits, targets, reference_nll_rows)
}

/// The sum of `rows(logits, targets)` over the rows whose target is not
/// ignored. Ignored rows are computed against token 0 (a valid row for the
/// fused kernels) and masked out: the backward then seeds them with zero.
fn kept_rows_sum<B: Backend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
    rows: impl FnOnce(Tensor<B, 2>, Tensor<B, 1, Int>) -> Tensor<B, 1>,
) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    let targets = targets.reshape([batch * seq]);
    let ignored = targets.clone().lower_elem(0);
    rows(
        logits.reshape([batch * seq, vocab]),
        targets.mask_fill(ignored.clone(), 0),
    )
    .mask_fill(ignored, 0.0)
    .sum()
}

/// The number of targets that are not ignored, as a float `[1]` on their
/// device (no host round trip).
pub fn kept_targets<B: Backend>(targets: &Tensor<B, 2, Int>) -> Tensor<B, 1> {
    targets.clone().greater_equal_elem(0).int().sum().float()
}

/// [`nll_rows`] in tensor ops, for any backend: burn differentiates
/// `log_softmax` op by op.
pub fn reference_nll_rows<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    check_shapes(&logits, &targets);
    let rows = targets.dims()[0];
    log_softmax(cast_to(logits, DType::F32), 1)
        .gather(1, targets.reshape([rows, 1]))
        .reshape([rows])
        .neg()
}

fn check_shapes<B: Backend>(logits: &Tensor<B, 2>, targets: &Tensor<B, 1, Int>) {
    assert_eq!(
        logits.dims()[0],
        targets.dims()[0],
        "cross-entropy: {} rows of logits, {} targets",
        logits.dims()[0],
        targets.dims()[0]
    );
}

/// The loss per row and each row's log-sum-exp, both f32 `[rows]`.
fn nll_forward<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> (Tensor<B, 1>, Tensor<B, 1>) {
    #[cfg(feature = "cuda")]
    if let Some((nll, lse)) = super::cuda::forward(&logits, &targets) {
        return (nll, lse);
    }
    let rows = targets.dims()[0];
    let x = cast_to(logits, DType::F32);
    let max = x.clone().max_dim(1);
    let lse = (x.clone() - max.clone()).exp().sum_dim(1).log() + max;
    let picked = x.gather(1, targets.reshape([rows, 1]));
    ((lse.clone() - picked).reshape([rows]), lse.reshape([rows]))
}

/// `grad[row] · (softmax(logits) − onehot(target))`, in the logits' dtype.
fn nll_backward<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    lse: Tensor<B, 1>,
    grad: Tensor<B, 1>,
) -> Tensor<B, 2> {
    #[cfg(feature = "cuda")]
    if let Some(dlogits) = super::cuda::backward(&logits, &targets, &lse, &grad) {
        return dlogits;
    }
    let dtype = logits.dtype();
    let [rows, _] = logits.dims();
    let probs = (cast_to(logits, DType::F32) - lse.reshape([rows, 1])).exp();
    let minus_one = Tensor::<B, 2>::full([rows, 1], -1.0, (&probs.device(), DType::F32));
    let dlogits = probs.scatter(
        1,
        targets.reshape([rows, 1]),
        minus_one,
        IndexingUpdateOp::Add,
    ) * cast_to(grad, DType::F32).reshape([rows, 1]);
    cast_to(dlogits, dtype)
}

#[derive(Debug)]
struct CrossEntropy;

impl<B: Backend> Backward<B, 1> for CrossEntropy {
    /// The logits, the targets and each row's log-sum-exp.
    type State = (FloatTensor<B>, IntTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (logits, targets, lse) = ops.state;
        let [parent] = ops.parents;
        if let Some(node) = parent {
            let dlogits = nll_backward::<B>(
                Tensor::from_primitive(TensorPrimitive::Float(logits)),
                Tensor::from_primitive(targets),
                Tensor::from_primitive(TensorPrimitive::Float(lse)),
                Tensor::from_primitive(TensorPrimitive::Float(grad)),
            );
            grads.register::<B>(node.id, dlogits.into_primitive().tensor());
        }
    }
}

/// [`nll_rows`] on `Autodiff<B>` as one operation.
fn tracked<B: Backend>(
    logits: Tensor<Autodiff<B>, 2>,
    targets: Tensor<Autodiff<B>, 1, Int>,
) -> Tensor<Autodiff<B>, 1> {
    let logits = logits.into_primitive().tensor();
    let targets = targets.into_primitive();
    let (nll, lse) = nll_forward::<B>(
        Tensor::from_primitive(TensorPrimitive::Float(logits.primitive.clone())),
        Tensor::from_primitive(targets.clone()),
    );
    let result = nll.into_primitive().tensor();
    let out = record(CrossEntropy, [logits], result, |[logits]| {
        (logits, targets, lse.into_primitive().tensor())
    });
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    type F = Flex;

    /// Logits with a few large values (so the log-sum-exp needs its shift)
    /// and targets spread over the vocabulary.
    fn inputs(rows: usize, vocab: usize, dtype: DType) -> (Tensor<F, 2>, Tensor<F, 1, Int>) {
        let device = Default::default();
        let logits = Tensor::<F, 2>::random([rows, vocab], Distribution::Normal(0.0, 3.0), &device)
            .cast(dtype);
        let targets = Tensor::<F, 1, Int>::from_data(
            (0..rows)
                .map(|r| ((r * 7919) % vocab) as i64)
                .collect::<Vec<_>>()
                .as_slice(),
            &device,
        );
        (logits, targets)
    }

    fn max_abs_diff<const D: usize>(a: Tensor<F, D>, b: Tensor<F, D>) -> f32 {
        (cast_to(a, DType::F32) - cast_to(b, DType::F32))
            .abs()
            .max()
            .into_scalar()
    }

    /// Values and logits gradients of the fused operation against burn's
    /// `log_softmax`, with a row-dependent upstream gradient.
    fn compare(dtype: DType, tolerance: f32) {
        let (logits, targets) = inputs(9, 37, dtype);
        let weights = Tensor::<Autodiff<F>, 1>::from_data(
            (0..9)
                .map(|r| 0.5 + r as f32)
                .collect::<Vec<_>>()
                .as_slice(),
            &Default::default(),
        );
        let run = |fused: bool| {
            let x = Tensor::<Autodiff<F>, 2>::from_inner(logits.clone()).require_grad();
            let t = Tensor::<Autodiff<F>, 1, Int>::from_inner(targets.clone());
            let nll = if fused {
                nll_rows(x.clone(), t)
            } else {
                reference_nll_rows(x.clone(), t)
            };
            assert_eq!(nll.dtype(), DType::F32);
            let grads = (nll.clone() * weights.clone()).sum().backward();
            let dx = x.grad(&grads).expect("the loss depends on the logits");
            assert_eq!(dx.dtype(), dtype);
            (nll.inner(), dx)
        };
        let ((nll, dx), (want_nll, want_dx)) = (run(true), run(false));
        let (value_err, grad_err) = (max_abs_diff(nll, want_nll), max_abs_diff(dx, want_dx));
        assert!(value_err <= tolerance, "{dtype:?}: loss off by {value_err}");
        assert!(
            grad_err <= tolerance,
            "{dtype:?}: gradient off by {grad_err}"
        );
    }

    #[test]
    fn fused_loss_matches_log_softmax_in_f32() {
        compare(DType::F32, 1e-5);
    }

    #[test]
    fn fused_loss_matches_log_softmax_in_bf16() {
        // Both compute in f32 from the same bf16 logits; the gradients are
        // rounded to bf16 (8 bits) at the end: one ulp at the largest, 8.5, is 0.03.
        compare(DType::BF16, 0.07);
    }

    #[test]
    fn loss_sum_adds_the_rows() {
        let (logits, targets) = inputs(6, 11, DType::F32);
        let sum = nll_sum(
            logits.clone().reshape([2, 3, 11]),
            targets.clone().reshape([2, 3]),
        );
        let rows = reference_nll_rows(logits, targets).sum();
        assert!(max_abs_diff(sum, rows) < 1e-4);
    }
}
