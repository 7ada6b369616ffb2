//! Next-token cross-entropy.

use burn::tensor::{activation::log_softmax, backend::Backend, DType, Int, Tensor};

/// Mean next-token cross-entropy of `logits [batch, seq, vocab]` against
/// `targets [batch, seq]`, in nats; in f32 whatever the logits' dtype.
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    let logits = if logits.dtype() == DType::F32 {
        logits
    } else {
        logits.cast(DType::F32)
    };
    let log_probs = log_softmax(logits.reshape([batch * seq, vocab]), 1);
    let picked = log_probs.gather(1, targets.reshape([batch * seq, 1]));
    picked.mean().neg()
}
