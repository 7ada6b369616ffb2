//! Where gradients go once they reach the host: accumulated in the store's
//! buffer (their norm measured as they land), only measured, or applied at
//! once (fused mode).

use std::time::Instant;

use burn::tensor::backend::{AutodiffBackend, Backend};

use super::StreamedModel;
use super::{DeviceTransfer, Engine, AD};
use crate::host::norm::{grad_sum_of_squares, sum_of_squares, sum_of_squares_outside};
use crate::host::optim::{GradSlice, UpdateSlices};
use crate::host::rows::{write_into, write_into_sum_sq};
use crate::store::GradBuffer;
use crate::transfer::PendingGradients;

/// Where a block's gradients go once they are on the host.
pub(super) enum Sink {
    /// Into the store's gradient buffer: written over for the first
    /// micro-batch (every slot of every group arrives once per micro-batch,
    /// so no zeroing pass is needed), added for the others. The `last`
    /// micro-batch measures the squared norm of each finished group
    /// (`Engine::group_sum_sq`).
    Accumulate { first: bool, last: bool },
    /// Only add their squared norm (first pass of fused + clipping).
    Norm(f64),
    /// Apply the update at once (fused), with the gradients scaled.
    Update { step: u64, lr: f64, scale: f32 },
}

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// Hands group `g`'s gradient copies to the host worker (or runs it
    /// here without one), which writes them into the group's gradient buffer:
    /// over it for the first micro-batch, added for the others. The last
    /// micro-batch measures the squared norm of everything but `unmeasured`
    /// (a range of the group; empty for a whole block).
    pub(super) fn fold_into_store(
        &mut self,
        g: usize,
        pending: PendingGradients<DeviceTransfer>,
        sink: &Sink,
        unmeasured: std::ops::Range<usize>,
    ) {
        let Sink::Accumulate { first, last } = *sink else {
            unreachable!("gradients are folded into the store only when accumulating")
        };
        self.run_on_group(
            g,
            false,
            Box::new(move |lent| {
                let buffer = lent.slabs.grads.as_mut().expect("gradient buffer");
                match buffer {
                    GradBuffer::F32(slab) => {
                        let grads = slab.as_mut_slice();
                        pending.finish(grads, !first);
                        if last {
                            sum_of_squares_outside(grads, unmeasured)
                        } else {
                            0.0
                        }
                    }
                    GradBuffer::Bf16(slab) => {
                        // One micro-batch (checked when the step starts),
                        // a whole block (measured whole).
                        debug_assert!(first && last && unmeasured.is_empty());
                        pending.finish_bf16(slab.as_mut_slice());
                        grad_sum_of_squares(GradSlice::Bf16(slab.as_slice()))
                    }
                }
            }),
        );
    }

    pub(super) fn sink_group(&mut self, g: usize, grads: &[f32], sink: &mut Sink) {
        let started = Instant::now();
        self.sink_group_now(g, grads, sink);
        self.split.optimizer_s += started.elapsed().as_secs_f64();
    }

    pub(super) fn sink_group_now(&mut self, g: usize, grads: &[f32], sink: &mut Sink) {
        let group = &mut self.store.groups[g];
        match sink {
            Sink::Accumulate { first, last } => {
                let buffer = group
                    .grads
                    .as_mut()
                    .and_then(GradBuffer::f32_mut)
                    .expect("an f32 gradient buffer (the stem's)");
                match (*last, g, self.embedding_slot) {
                    (false, ..) => write_into(buffer, grads, !*first),
                    // Measured as the early fold does (head, then table), so
                    // both modes agree to the bit.
                    (true, 0, Some(slot)) => {
                        write_into(buffer, grads, !*first);
                        let (table, width) =
                            (group.slots[slot].range(), group.slots[slot].shape[1]);
                        let head = sum_of_squares_outside(buffer, table.clone());
                        let table_sum_sq = self.table_touch.sum_sq(&buffer[table], width);
                        self.add_sum_sq(0, head);
                        self.add_sum_sq(0, table_sum_sq);
                    }
                    (true, ..) => {
                        let sum_sq = write_into_sum_sq(buffer, grads, !*first);
                        self.add_sum_sq(g, sum_sq);
                    }
                }
            }
            Sink::Norm(sum) => *sum += sum_of_squares(grads),
            Sink::Update { step, lr, scale } => {
                let slices = UpdateSlices {
                    params: group.params.as_mut_slice(),
                    moments: group.moments.slices(),
                    grads: GradSlice::F32(grads),
                    bf16: self.bf16.as_mut().map(|c| c.updated(g)),
                };
                self.config.optimizer.update(*step, *lr, *scale, slices);
            }
        }
    }

    /// Adds the stem's parameter gradients (head or embedding) into `out`.
    pub(super) fn stem_grads_to_host(
        &mut self,
        stem_ad: &M::TrainModule,
        grads: &<AD<B> as AutodiffBackend>::Gradients,
        out: &mut [f32],
        lane: usize,
    ) {
        let group = &self.store.groups[0];
        self.lanes[lane].pager.gradients_to_host::<AD<B>, _>(
            stem_ad,
            group,
            &self.block_ids,
            grads,
            out,
            true,
        );
    }
}

/// The first `numel` values of the gradient buffer, grown (once) if short.
/// Whoever fills them writes every slot, so they are not zeroed per group.
pub(super) fn group_prefix(buffer: &mut Vec<f32>, numel: usize) -> &mut [f32] {
    if buffer.len() < numel {
        buffer.resize(numel, 0.0);
    }
    &mut buffer[..numel]
}
