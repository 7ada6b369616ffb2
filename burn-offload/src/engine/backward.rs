//! Phase 3: the backward, one block at a time from the last, each
//! recomputed from its checkpoint (or its graph kept from the forward), its
//! gradients handed to the host as soon as the next block is submitted.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::forward::ForwardState;
use super::sink::{group_prefix, Sink};
use super::StreamedModel;
use super::{BlockAd, DeviceTransfer, Engine, AD};
use crate::transfer::PendingGradients;
use crate::DecoderBlock;

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// Phase 3 from `dy`, the last block's output gradient, with `next` the
    /// last recomputed block already bound; returns `dx_0`, the embedding's
    /// output gradient.
    ///
    /// Block i's gradients are handed on once block i-1's backward is
    /// submitted. In overlap mode (`beside`) their copies start at once on a
    /// stream beside the compute stream (ordered right behind block i's
    /// backward) and the host worker folds them into the buffer. Otherwise
    /// the copies are queued right behind block i's backward, block i-1's
    /// backward right behind them (no host round trip between), and the host
    /// takes them (fused: the optimizer its share) while block i-1 computes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward(
        &mut self,
        blocks: &[M::Block],
        state: ForwardState<B, M>,
        mut next: Option<BlockAd<B, M>>,
        mut dy: Tensor<B, 3>,
        beside: bool,
        sink: &mut Sink,
    ) -> Tensor<B, 3> {
        let num_blocks = blocks.len();
        let ForwardState {
            mut checkpoints,
            mut graphs,
        } = state;
        // The blocks from here on kept their graphs in the forward.
        let first_kept = num_blocks - graphs.len();
        // One buffer serves the fused sinks, kept across steps.
        let mut block_grads = std::mem::take(&mut self.grad_buffer);
        let mut queued: Option<(usize, PendingGradients<DeviceTransfer>)> = None;
        for i in (0..num_blocks).rev() {
            let bind = Instant::now();
            let launch;
            let (block, x_in, y) = if i >= first_kept {
                // The forward kept this block's graph: nothing to recompute.
                let kept = graphs.pop().expect("one graph per kept block");
                if i == first_kept && i > 0 {
                    next = Some(self.bind_block_ad(blocks, i - 1));
                }
                launch = Instant::now();
                kept
            } else {
                let block = next.take().expect("block bound ahead");
                let checkpoint = checkpoints.pop().expect("one checkpoint per block");
                let checkpoint = self.pager.unstash(checkpoint, &self.device);
                // Block i's weights and checkpoint have landed; block i-1's
                // weights are copied while block i computes.
                self.pager.ready::<B>(&self.device);
                let block = self.landed(block);
                if i > 0 {
                    next = Some(self.bind_block_ad(blocks, i - 1));
                }
                launch = Instant::now();
                let x_in = Tensor::<AD<B>, 3>::from_inner(checkpoint).require_grad();
                let y = block.forward(x_in.clone());
                (block, x_in, y)
            };
            self.split.backward_bind_s += (launch - bind).as_secs_f64();
            // Seeded with ones, `y ⊙ dy` hands `dy` to `y`: no full sum (a
            // reduction over the block's output) before the backward.
            let grads = (y * Tensor::from_inner(dy)).backward();
            dy = x_in.grad(&grads).expect("a block depends on its input");
            self.pager.flush::<B>(&self.device);
            self.split.backward_launch_s += launch.elapsed().as_secs_f64();
            if !self.config.overlap {
                // The serialised baseline: no CPU work while the device computes.
                let waited = Instant::now();
                self.pager.sync::<B>(&self.device);
                self.split.backward_wait_s += waited.elapsed().as_secs_f64();
            }
            if let Some((g, pending)) = queued.take() {
                self.take_block_grads(g, pending, &mut block_grads, sink);
                // The worker takes groups in the order they are handed: once
                // the one `bound` groups back is done, so are those before it.
                let bound = self.config.gradient_blocks_in_flight;
                if bound > 0 && g + bound <= num_blocks {
                    self.take_back(g + bound);
                }
            }
            let pending = self.pager.start_gradients::<AD<B>, _>(
                &block,
                &self.store.groups[i + 1],
                &grads,
                beside,
            );
            queued = Some((i + 1, pending));
            drop(block);
            self.pager.evict(i + 1);
            self.mark(format_args!("block {i} backward submitted"));
        }
        if let Some((g, pending)) = queued.take() {
            self.take_block_grads(g, pending, &mut block_grads, sink);
        }
        self.grad_buffer = block_grads;
        dy
    }

    /// Hands group `g`'s queued gradient copies to the sink. Accumulated
    /// gradients go straight into the group's buffer, on the host worker in
    /// overlap mode (the thread that drives the device does not wait for the
    /// copies); the fused sinks wait here, via `buffer`.
    fn take_block_grads(
        &mut self,
        g: usize,
        pending: PendingGradients<DeviceTransfer>,
        buffer: &mut Vec<f32>,
        sink: &mut Sink,
    ) {
        if let Sink::Accumulate { .. } = sink {
            self.fold_into_store(g, pending, sink, 0..0);
            return;
        }
        let download = Instant::now();
        let grads = group_prefix(buffer, self.store.groups[g].numel());
        pending.finish(grads, false);
        self.split.download_s += download.elapsed().as_secs_f64();
        self.sink_group(g, grads, sink);
    }
}
