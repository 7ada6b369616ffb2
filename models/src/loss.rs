//! Next-token cross-entropy.

use burn::tensor::{activation::log_softmax, backend::Backend, DType, Int, Tensor};

/// Mean next-token cross-entropy of `logits [batch, seq, vocab]` against
/// `targets [batch, seq]`, in nats; in f32 whatever the logits' dtype. The
/// mean is over the targets that are not ignored (negative, as
/// [`burn_offload::cross_entropy::IGNORE_INDEX`]): those add nothing to the
/// loss or its gradient.
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    let logits = if logits.dtype() == DType::F32 {
        logits
    } else {
        logits.cast(DType::F32)
    };
    let rows = batch * seq;
    let targets = targets.reshape([rows]);
    let ignored = targets.clone().lower_elem(0);
    let kept = targets.clone().greater_equal_elem(0).int().sum().float();
    let log_probs = log_softmax(logits.reshape([rows, vocab]), 1);
    let picked = log_probs
        .gather(1, targets.mask_fill(ignored.clone(), 0).reshape([rows, 1]))
        .reshape([rows])
        .mask_fill(ignored, 0.0);
    picked.sum().neg() / kept.clamp_min(1.0)
}
