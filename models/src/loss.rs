//! Next-token cross-entropy.

use burn::tensor::{backend::Backend, Int, Tensor};
use burn_offload::ops::cross_entropy::{kept_targets, reference_nll_sum};

/// Mean next-token cross-entropy of `logits [batch, seq, vocab]` against
/// `targets [batch, seq]`, in nats; in f32 whatever the logits' dtype, in
/// tensor ops that burn differentiates one by one (the reference the
/// engine's fused loss is tested against). The mean is over the targets that
/// are not ignored (negative, as
/// [`burn_offload::ops::cross_entropy::IGNORE_INDEX`]): those add nothing to the
/// loss or its gradient.
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let kept = kept_targets(&targets);
    reference_nll_sum(logits, targets) / kept.clamp_min(1.0)
}
