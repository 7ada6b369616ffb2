//! Phase 3: the backward, one block at a time from the last, each
//! recomputed from its checkpoint (or its graph kept from the forward), its
//! gradients handed to the host as soon as the next block is submitted.

use std::time::Instant;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

use super::forward::ForwardState;
use super::sink::{group_prefix, Sink};
use super::StreamedModel;
use super::{BlockAd, DeviceTransfer, Engine, EngineError, AD};
use crate::model::forward_block;
use crate::ops::attention::{replay, AttentionMemo};
use crate::transfer::{sum_lanes, PendingGradients};
use crate::Documents;

/// A backward pass's gradients on `Autodiff<B>`.
type Gradients<B> = <AD<B> as AutodiffBackend>::Gradients;

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// Phase 3 from `dy`, each lane's last block output gradient, with
    /// `next` each lane's last recomputed block already bound, lane `d`'s
    /// rows packed as `documents[d]` where given; returns each lane's
    /// `dx_0`, the embedding's output gradient.
    ///
    /// The lanes run each block in lockstep. Block i's gradients (summed
    /// over the lanes on the devices, then copied to the host from one lane)
    /// are handed on once block i-1's backward is submitted. In overlap mode
    /// (`beside`) their copies start at once on a stream beside the compute
    /// stream (ordered right behind block i's backward) and the host worker
    /// folds them into the buffer. Otherwise the copies are queued right
    /// behind block i's backward, block i-1's backward right behind them (no
    /// host round trip between), and the host takes them (fused: the
    /// optimizer its share) while block i-1 computes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward(
        &mut self,
        blocks: &[M::Block],
        states: Vec<ForwardState<B, M>>,
        documents: &[Option<&Documents>],
        mut next: Vec<Option<BlockAd<B, M>>>,
        dy: Vec<Tensor<B, 3>>,
        beside: bool,
        sink: &mut Sink,
    ) -> Result<Vec<Tensor<B, 3>>, EngineError> {
        let mut dy: Vec<Option<Tensor<B, 3>>> = dy.into_iter().map(Some).collect();
        let num_blocks = blocks.len();
        let lanes = states.len();
        let mut attention: Vec<Vec<AttentionMemo>> = Vec::with_capacity(states.len());
        let (mut checkpoints, mut graphs): (Vec<_>, Vec<_>) = states
            .into_iter()
            .map(|s| {
                attention.push(s.attention);
                (s.checkpoints, s.graphs)
            })
            .unzip();
        // The blocks from here on kept their graphs in the forward.
        let first_kept = num_blocks - graphs[0].len();
        // One buffer serves the fused sinks, kept across steps.
        let mut block_grads = std::mem::take(&mut self.grad_buffer);
        let mut queued: Option<(usize, PendingGradients<DeviceTransfer>)> = None;
        for i in (0..num_blocks).rev() {
            let mut done = Vec::with_capacity(lanes);
            for d in 0..lanes {
                let bind = Instant::now();
                let launch;
                let (block, x_in, y) = if i >= first_kept {
                    // The forward kept this block's graph: nothing to recompute.
                    let kept = graphs[d].pop().expect("one graph per kept block");
                    if i == first_kept && i > 0 {
                        next[d] = Some(self.bind_block_ad(blocks, i - 1, d));
                    }
                    launch = Instant::now();
                    kept
                } else {
                    let block = next[d].take().expect("block bound ahead");
                    let checkpoint = checkpoints[d].pop().expect("one checkpoint per block");
                    let lane = &mut self.lanes[d];
                    let checkpoint = lane.pager.unstash(checkpoint, &lane.device);
                    // Block i's weights and checkpoint have landed; block
                    // i-1's weights are copied while block i computes.
                    lane.pager.ready::<B>(&lane.device);
                    let block = self.landed(block);
                    if i > 0 {
                        next[d] = Some(self.bind_block_ad(blocks, i - 1, d));
                    }
                    launch = Instant::now();
                    let x_in = Tensor::<AD<B>, 3>::from_inner(checkpoint).require_grad();
                    // The forward's attention outputs, where it kept them.
                    let y = match attention[d].pop() {
                        Some(kept) => {
                            replay(kept, || forward_block(&block, x_in.clone(), documents[d]))
                        }
                        None => forward_block(&block, x_in.clone(), documents[d]),
                    };
                    (block, x_in, y)
                };
                self.split.backward_bind_s += (launch - bind).as_secs_f64();
                // Seeded with ones, `y ⊙ dy` hands `dy` to `y`: no full sum (a
                // reduction over the block's output) before the backward.
                let dy_d = dy[d].take().expect("each lane's output gradient");
                let grads = (y * Tensor::from_inner(dy_d)).backward();
                dy[d] = Some(x_in.grad(&grads).expect("a block depends on its input"));
                let lane = &self.lanes[d];
                lane.pager.flush::<B>(&lane.device);
                self.split.backward_launch_s += launch.elapsed().as_secs_f64();
                done.push((block, grads));
            }
            if !self.config.overlap {
                // The serialised baseline: no CPU work while the device computes.
                let waited = Instant::now();
                for lane in &self.lanes[..lanes] {
                    lane.pager.sync::<B>(&lane.device);
                }
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
            let pending = self.start_block_gradients(i, &done, beside)?;
            queued = Some((i + 1, pending));
            drop(done);
            for lane in &mut self.lanes[..lanes] {
                lane.pager.evict(i + 1);
            }
            self.mark(format_args!("block {i} backward submitted"));
        }
        if let Some((g, pending)) = queued.take() {
            self.take_block_grads(g, pending, &mut block_grads, sink);
        }
        self.grad_buffer = block_grads;
        Ok(dy
            .into_iter()
            .map(|dy| dy.expect("each lane's input gradient"))
            .collect())
    }

    /// Starts block `i`'s gradient copies to the host from each lane's bound
    /// block and gradients: one lane's straight from its gradients; several
    /// lanes' summed on the devices first, onto lane `i mod lanes` (so the
    /// lanes take turns at the copies). With processes, the sum is over
    /// theirs too, and each copies it to its own store.
    fn start_block_gradients(
        &mut self,
        i: usize,
        done: &[(BlockAd<B, M>, Gradients<B>)],
        beside: bool,
    ) -> Result<PendingGradients<DeviceTransfer>, EngineError> {
        let group = &self.store.groups[i + 1];
        if let ([(block, grads)], None) = (done, &self.processes) {
            return Ok(self.lanes[0]
                .pager
                .start_gradients::<AD<B>, _>(block, group, grads, beside));
        }
        let flat = done
            .iter()
            .zip(&self.lanes)
            .map(|((block, grads), lane)| {
                lane.pager.flat_gradients::<AD<B>, _>(block, group, grads)
            })
            .collect();
        let root = i % done.len();
        let sum = self.across_processes(sum_lanes::<DeviceTransfer, B>(flat, root))?;
        Ok(self.lanes[root]
            .pager
            .start_kept(sum, &self.store.groups[i + 1], beside))
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
