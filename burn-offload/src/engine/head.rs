//! Phase 2: the LM head and the loss in chunks of positions, each chunk its
//! own small graph, so `tokens × vocab` logits never exist at once.

use burn::module::{AutodiffModule, HasAutodiffModule};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use super::sink::Sink;
use super::StreamedModel;
use super::{BlockAd, DeviceTransfer, Engine, AD};
use crate::ops::cross_entropy::nll_sum;
use crate::transfer::{add_to, DeviceGrads, PendingGradients};
use crate::BlockModel;

/// What the head leaves for the backward.
pub(super) struct Head<B: Backend, M: BlockModel<B>>
where
    M::Block: HasAutodiffModule<AD<B>>,
{
    /// The sum of the tokens' losses, on the device.
    pub loss_sum: Option<Tensor<B, 1>>,
    /// `dL/dx_L`, the last block's output gradient.
    pub dy: Tensor<B, 3>,
    /// The head's gradients, unless already handed to the host worker.
    pub grads: Option<PendingGradients<DeviceTransfer>>,
    /// The last recomputed block, bound while the head ran.
    pub next: Option<BlockAd<B, M>>,
    /// Whether gradient copies run beside compute, for the host worker.
    pub beside: bool,
}

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// Phase 2 on the last block's output `x`: the loss of `targets` weighted
    /// by `weight`, its gradient `dy` for the backward, and the head's
    /// gradients on their way to the host (or to `sink` through the worker).
    /// Block `first_kept - 1`, the first the backward recomputes, is bound
    /// meanwhile.
    pub(super) fn head(
        &mut self,
        blocks: &[M::Block],
        first_kept: usize,
        x: Tensor<B, 3>,
        targets: &Tensor<B, 2, Int>,
        weight: &Tensor<B, 1>,
        sink: &Sink,
    ) -> Head<B, M> {
        let num_blocks = blocks.len();
        let stem_ad = self.bind_stem::<AD<B>, _>(
            M::TrainModule::from_inner(self.template.clone()),
            true,
            false,
        );
        self.pager.ready::<B>(&self.device);
        let stem_ad = self.landed_stem(stem_ad);
        self.mark("head: stem bound");
        // The last recomputed block's weights are copied during the head
        // (kept blocks are still bound from the forward).
        let next = (first_kept == num_blocks && num_blocks > 0)
            .then(|| self.bind_block_ad(blocks, num_blocks - 1));
        let [batch, seq, _] = x.dims();
        let weight_ad = Tensor::<AD<B>, 1>::from_inner(weight.clone());
        let chunk = (self.config.loss_chunk_tokens / batch).clamp(1, seq);
        // The loss and the head's gradients are summed over the chunks on
        // the device: nothing waits for a chunk, and the head's gradients
        // cross to the host once, queued behind the last chunk and collected
        // before the embedding backward adds to them.
        let mut loss_sum: Option<Tensor<B, 1>> = None;
        let mut head_grads = DeviceGrads::new(&self.store.groups[0]);
        let mut dx_chunks = Vec::with_capacity(seq.div_ceil(chunk));
        for start in (0..seq).step_by(chunk) {
            let len = chunk.min(seq - start);
            let xc = Tensor::<AD<B>, 3>::from_inner(x.clone().narrow(1, start, len)).require_grad();
            let tc = Tensor::<AD<B>, 2, Int>::from_inner(targets.clone().narrow(1, start, len));
            // One autodiff operation, f32 inside, one kernel each way on CUDA
            // (`ops::cross_entropy`).
            let nll_sum = nll_sum(stem_ad.head(xc.clone()), tc);
            add_to(&mut loss_sum, nll_sum.clone().inner());
            let grads = (nll_sum * weight_ad.clone()).backward();
            dx_chunks.push(xc.grad(&grads).expect("the head depends on its input"));
            self.pager.keep_gradients::<AD<B>, _>(
                &stem_ad,
                &self.store.groups[0],
                &self.block_ids,
                &grads,
                &mut head_grads,
            );
            self.mark(format_args!("head: positions {start}.. done"));
        }
        drop(stem_ad);
        // With the host worker folding them, the head's gradients (the LM
        // head's 262 MB at 0.85B) cross on the download stream: on the
        // compute stream the first block's backward would wait for the copy.
        let beside = self.worker.is_some() && matches!(sink, Sink::Accumulate { .. });
        let head_grads = self
            .pager
            .start_kept(head_grads, &self.store.groups[0], beside);
        self.pager.evict(0);
        if let Some(slot) = self.embedding_slot {
            let first = !matches!(sink, Sink::Accumulate { first: false, .. });
            let rows = self.store.groups[0].slots[slot].shape[0];
            self.table_touch
                .begin(first, rows, head_grads.has_gradient(slot));
        }
        let dy = Tensor::cat(dx_chunks, 1);
        // With the host worker and a lookup embedding, the head's gradients
        // go into the store now, on the worker while the blocks' backward
        // runs; phase 4 then only adds the table's rows. Otherwise phase 4
        // takes them (see `embedding_grads_on_host`).
        let grads = match (self.embedding_slot, beside) {
            (Some(slot), true) => {
                self.fold_head_grads(slot, head_grads, sink);
                None
            }
            _ => Some(head_grads),
        };
        Head {
            loss_sum,
            dy,
            grads,
            next,
            beside,
        }
    }
}
