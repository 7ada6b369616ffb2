//! Phase 2: the LM head and the loss in chunks of positions, each chunk its
//! own small graph, so `tokens × vocab` logits never exist at once.

use burn::module::{AutodiffModule, HasAutodiffModule};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use super::sink::Sink;
use super::StreamedModel;
use super::{BlockAd, DeviceTransfer, Engine, EngineError, AD};
use crate::ops::cross_entropy::nll_sum;
use crate::transfer::{add_to, sum_lanes, DeviceGrads, PendingGradients};
use crate::BlockModel;

/// What the head leaves for the backward, per lane where it differs.
pub(super) struct Head<B: Backend, M: BlockModel<B>>
where
    M::Block: HasAutodiffModule<AD<B>>,
{
    /// Each lane's sum of its tokens' losses, on its device.
    pub loss_sums: Vec<Option<Tensor<B, 1>>>,
    /// Each lane's `dL/dx_L`, the last block's output gradient.
    pub dy: Vec<Tensor<B, 3>>,
    /// The head's gradients (summed over the lanes), unless already handed
    /// to the host worker.
    pub grads: Option<PendingGradients<DeviceTransfer>>,
    /// Each lane's last recomputed block, bound while the head ran.
    pub next: Vec<Option<BlockAd<B, M>>>,
    /// Whether gradient copies run beside compute, for the host worker.
    pub beside: bool,
}

/// One lane's share of the head.
struct LaneHead<B: Backend, N> {
    loss_sum: Option<Tensor<B, 1>>,
    dy: Tensor<B, 3>,
    grads: DeviceGrads<B>,
    next: Option<N>,
}

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// Phase 2 on each lane's last block output `x[d]`: the loss of
    /// `targets[d]` weighted by `weights[d]`, its gradient `dy` for the
    /// backward, and the head's gradients, summed over the lanes, on their
    /// way to the host (or to `sink` through the worker). Block
    /// `first_kept - 1`, the first the backward recomputes, is bound
    /// meanwhile.
    pub(super) fn head(
        &mut self,
        blocks: &[M::Block],
        first_kept: usize,
        x: Vec<Tensor<B, 3>>,
        targets: &[Tensor<B, 2, Int>],
        weights: &[Tensor<B, 1>],
        sink: &Sink,
    ) -> Result<Head<B, M>, EngineError> {
        let mut head = Head {
            loss_sums: Vec::with_capacity(x.len()),
            dy: Vec::with_capacity(x.len()),
            grads: None,
            next: Vec::with_capacity(x.len()),
            beside: false,
        };
        let mut kept = Vec::with_capacity(x.len());
        for (d, x) in x.into_iter().enumerate() {
            let lane = self.head_lane(blocks, first_kept, x, &targets[d], &weights[d], d);
            head.loss_sums.push(lane.loss_sum);
            head.dy.push(lane.dy);
            head.next.push(lane.next);
            kept.push(lane.grads);
        }
        // With the host worker folding them, the head's gradients (the LM
        // head's 262 MB at 0.85B) cross on the download stream: on the
        // compute stream the first block's backward would wait for the copy.
        let beside = self.worker.is_some() && matches!(sink, Sink::Accumulate { .. });
        let head_grads = self.across_processes(sum_lanes::<DeviceTransfer, B>(kept, 0))?;
        let head_grads = self.lanes[0]
            .pager
            .start_kept(head_grads, &self.store.groups[0], beside);
        if let Some(slot) = self.embedding_slot {
            let first = !matches!(sink, Sink::Accumulate { first: false, .. });
            let rows = self.store.groups[0].slots[slot].shape[0];
            self.table_touch
                .begin(first, rows, head_grads.has_gradient(slot));
        }
        // With the host worker and a lookup embedding, the head's gradients
        // go into the store now, on the worker while the blocks' backward
        // runs; phase 4 then only adds the table's rows. Otherwise phase 4
        // takes them (see `embedding_grads_on_host`).
        head.grads = match (self.embedding_slot, beside) {
            (Some(slot), true) => {
                self.fold_head_grads(slot, head_grads, sink);
                None
            }
            _ => Some(head_grads),
        };
        head.beside = beside;
        Ok(head)
    }

    /// The head on lane `d`: its loss, `dy` and the head's gradients, summed
    /// over the loss chunks on the device.
    fn head_lane(
        &mut self,
        blocks: &[M::Block],
        first_kept: usize,
        x: Tensor<B, 3>,
        targets: &Tensor<B, 2, Int>,
        weight: &Tensor<B, 1>,
        d: usize,
    ) -> LaneHead<B, BlockAd<B, M>> {
        let num_blocks = blocks.len();
        let stem_ad = self.bind_stem::<AD<B>, _>(
            M::TrainModule::from_inner(self.template.clone()),
            true,
            false,
            d,
        );
        let lane = &mut self.lanes[d];
        lane.pager.ready::<B>(&lane.device);
        let stem_ad = self.landed_stem(stem_ad);
        self.mark("head: stem bound");
        // The last recomputed block's weights are copied during the head
        // (kept blocks are still bound from the forward).
        let next = (first_kept == num_blocks && num_blocks > 0)
            .then(|| self.bind_block_ad(blocks, num_blocks - 1, d));
        let [batch, seq, _] = x.dims();
        let weight_ad = Tensor::<AD<B>, 1>::from_inner(weight.clone());
        let chunk = (self.config.loss_chunk_tokens / batch).clamp(1, seq);
        // The loss and the head's gradients are summed over the chunks on
        // the device: nothing waits for a chunk, and the head's gradients
        // cross to the host once, queued behind the last chunk and collected
        // before the embedding backward adds to them.
        let mut loss_sum: Option<Tensor<B, 1>> = None;
        let mut grads = DeviceGrads::new(&self.store.groups[0]);
        let mut dx_chunks = Vec::with_capacity(seq.div_ceil(chunk));
        for start in (0..seq).step_by(chunk) {
            let len = chunk.min(seq - start);
            let xc = Tensor::<AD<B>, 3>::from_inner(x.clone().narrow(1, start, len)).require_grad();
            let tc = Tensor::<AD<B>, 2, Int>::from_inner(targets.clone().narrow(1, start, len));
            // One autodiff operation, f32 inside, one kernel each way on CUDA
            // (`ops::cross_entropy`).
            let nll_sum = nll_sum(stem_ad.head(xc.clone()), tc);
            add_to(&mut loss_sum, nll_sum.clone().inner());
            let chunk_grads = (nll_sum * weight_ad.clone()).backward();
            dx_chunks.push(
                xc.grad(&chunk_grads)
                    .expect("the head depends on its input"),
            );
            self.lanes[d].pager.keep_gradients::<AD<B>, _>(
                &stem_ad,
                &self.store.groups[0],
                &self.block_ids,
                &chunk_grads,
                &mut grads,
            );
            self.mark(format_args!("head: positions {start}.. done"));
        }
        drop(stem_ad);
        self.lanes[d].pager.evict(0);
        LaneHead {
            loss_sum,
            dy: Tensor::cat(dx_chunks, 1),
            grads,
            next,
        }
    }
}
