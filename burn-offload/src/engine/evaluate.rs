//! Evaluation: the loss of held-out tokens under the model, forward only.
//! The blocks stream as in phase 1 with no graph and nothing kept, and the
//! head takes the loss in the same chunks as phase 2, without its backward.

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor};

use super::forward::not_empty;
use super::{Engine, EngineError, StreamedModel};
use crate::engine::config::BatchError;
use crate::ops::cross_entropy::nll_sum;
use crate::transfer::{add_to, on_device};
use crate::Documents;

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// The summed negative log-likelihood of `targets` `[batch, seq]` after
    /// `inputs` (ignored, negative, targets add nothing), in f32 on the
    /// first device, with `documents`' rows packed as in
    /// [`Engine::step_in`]. Nothing is kept and the store is not touched:
    /// the training that follows is the same with or without it.
    pub fn nll_sum(
        &mut self,
        inputs: &Tensor<B, 2, Int>,
        targets: &Tensor<B, 2, Int>,
        documents: Option<&Documents>,
    ) -> Result<f64, EngineError> {
        let [batch, seq] = not_empty(inputs)?;
        if targets.dims() != [batch, seq] {
            return Err(BatchError::TargetShape {
                index: 0,
                inputs: [batch, seq],
                targets: targets.dims(),
            }
            .into());
        }
        let device = self.lanes[0].device.clone();
        let blocks = self.template.blocks().to_vec();
        let inputs = [on_device(inputs.clone(), &device)];
        let targets = on_device(targets.clone(), &device);
        let (x, _) = self
            .stream_forward(&blocks, &inputs, &[documents], false)?
            .pop()
            .expect("one lane");
        let chunk = (self.config.loss_chunk_tokens / batch).clamp(1, seq);
        let sum = self.with_stem(|stem| {
            let mut sum: Option<Tensor<B, 1>> = None;
            for start in (0..seq).step_by(chunk) {
                let len = chunk.min(seq - start);
                let logits = stem.head(x.clone().narrow(1, start, len));
                add_to(
                    &mut sum,
                    nll_sum(logits, targets.clone().narrow(1, start, len)),
                );
            }
            sum.expect("at least one chunk")
        });
        Ok(sum.into_scalar().elem::<f64>())
    }
}
