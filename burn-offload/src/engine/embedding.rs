//! The embedding at both ends of a step: the forward's lookup on the host
//! side of the bus (only the rows a batch reads cross it), and phase 4, the
//! embedding's backward from `dx_0`, added to the head's gradients.

use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use rayon::prelude::*;

use super::config::BatchError;
use super::ledger::{Part, TableRows};
use super::sink::{group_prefix, Sink};
use super::{embed_tokens, StreamedModel};
use super::{DeviceTransfer, Engine, EngineError, AD};
use crate::host::lookup::{check_tokens, gather_rows, scatter_add_rows, TokenRows};
use crate::host::norm::sum_of_squares;
use crate::host::optim::quant::QUANT_BLOCK;
use crate::ops::embedding::segment_sums;
use crate::precision::cast_to;
use crate::store::GradBuffer;
use crate::transfer::PendingGradients;
use crate::Documents;

/// The embedding-table rows whose gradient a step has written, for the
/// table's squared norm: where the head leaves the table alone (no tied
/// weights), every other row of its gradient is zero, so the norm reads only
/// these (a few hundred of 32000 rows with the byte tokenizer, where reading
/// the whole table's 262 MB lay on the path to the next step).
#[derive(Default)]
pub(super) struct TableTouch {
    rows: Vec<bool>,
    /// The head wrote into the table's gradient too: every row counts.
    dense: bool,
}

impl TableTouch {
    /// Starts a micro-batch whose head did (`head`) or did not write a
    /// gradient into the table of `rows` rows; the first one of a step resets.
    pub(super) fn begin(&mut self, first: bool, rows: usize, head: bool) {
        if first {
            self.rows.clear();
            self.rows.resize(rows, false);
            self.dense = false;
        }
        self.dense |= head;
    }

    /// Adds `dy` into the table's gradient `grads` (shape `shape`, `[rows,
    /// width]`: the gradient of a lookup in it) for `tokens` and records the
    /// rows it wrote.
    fn scatter(
        &mut self,
        grads: &mut [f32],
        shape: &[usize],
        tokens: &[i64],
        dy: &LookupGrads,
    ) -> Result<(), EngineError> {
        match dy {
            LookupGrads::Positions(rows) => {
                scatter_add_rows(grads, shape[1], tokens, rows)
                    .map_err(|token| token_error(token, shape[0]))?;
            }
            LookupGrads::Sums(rows, sums) => rows.add_sums(grads, shape[1], sums),
        }
        for &t in tokens {
            self.rows[t as usize] = true;
        }
        Ok(())
    }

    /// The squared norm of the table's accumulated gradient `grads` (rows of
    /// `width`), the same sum whichever mode measures it.
    pub(super) fn sum_sq(&self, grads: &[f32], width: usize) -> f64 {
        if self.dense {
            return sum_of_squares(grads);
        }
        let per_row: Vec<f64> = grads
            .par_chunks(width)
            .zip(self.rows.par_iter())
            .map(|(row, &touched)| {
                if touched {
                    row.iter().map(|&v| (v as f64) * (v as f64)).sum()
                } else {
                    0.0
                }
            })
            .collect();
        per_row.iter().sum()
    }
}

/// The embedding's output gradient `dy` on the host, for the table's.
pub(super) enum LookupGrads {
    /// Row `p` is position `p`'s.
    Positions(Vec<f32>),
    /// Summed per segment of a token's positions on the device.
    Sums(TokenRows, Vec<f32>),
}

impl LookupGrads {
    /// The host buffer, for the next step.
    fn into_buffer(self) -> Vec<f32> {
        match self {
            LookupGrads::Positions(buffer) | LookupGrads::Sums(_, buffer) => buffer,
        }
    }
}

/// A token outside the embedding table's `rows` rows.
pub(super) fn token_error(token: i64, rows: usize) -> EngineError {
    BatchError::Token { token, rows }.into()
}

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// Phase 4: the embedding's backward from each lane's `dy` (`dx_0`, for
    /// `inputs[d]`; with processes, every lane's of the run), added to the
    /// head's gradients (`None`: already folded into the store), to `sink`.
    pub(super) fn embedding_backward(
        &mut self,
        inputs: &[Tensor<B, 2, Int>],
        documents: &[Option<&Documents>],
        dy: Vec<Tensor<B, 3>>,
        head_grads: Option<PendingGradients<DeviceTransfer>>,
        sink: &mut Sink,
    ) -> Result<(), EngineError> {
        let lanes = dy.len();
        let Some(head_grads) = head_grads else {
            let slot = self
                .embedding_slot
                .expect("folded early only with a lookup");
            for (d, dy) in dy.into_iter().enumerate() {
                // Only the last lane's rows complete the table's gradient.
                let lane_sink = match *sink {
                    Sink::Accumulate { first, last } => Sink::Accumulate {
                        first,
                        last: last && d + 1 == lanes,
                    },
                    _ => unreachable!("folded early only when accumulating"),
                };
                let lane = self.lane_of(d);
                self.add_embedding_grads_in_store(slot, &inputs[d], dy, &lane_sink, lane)?;
            }
            return Ok(());
        };
        let mut buffer = std::mem::take(&mut self.grad_buffer);
        let stem_grads = group_prefix(&mut buffer, self.store.groups[0].numel());
        // The head's gradients are written over the buffer with lane 0's
        // embedding gradients; the other lanes' add to them.
        let mut head_grads = Some(head_grads);
        let mut filled = Ok(());
        for (d, dy) in dy.into_iter().enumerate() {
            let head = head_grads.take();
            let lane = self.lane_of(d);
            filled = match self.embedding_slot {
                Some(slot) => {
                    self.embedding_grads_on_host(slot, &inputs[d], dy, head, stem_grads, lane)
                }
                None => {
                    let tokens = (&inputs[d], documents[d]);
                    self.embedding_grads_on_device(tokens, dy, head, stem_grads, lane);
                    Ok(())
                }
            };
            if filled.is_err() {
                break;
            }
        }
        if filled.is_ok() {
            self.sink_group(0, stem_grads, sink);
        }
        self.grad_buffer = buffer;
        filled
    }

    /// The embedding of each lane's `inputs[d]` where `embed` is a lookup in
    /// the table at stem slot `slot`: the distinct rows it reads, gathered
    /// from the store on the host and uploaded, then each position's picked
    /// on the device (`host::lookup`; with a byte tokenizer a few hundred
    /// rows, where the 64k positions' rows were 512 MB to gather and copy at
    /// the step boundary). With the step's update deferred
    /// ([`Engine::deferred`]), the rows read here (by any lane) are updated
    /// first, on this thread, then the host worker gets the blocks' updates
    /// and the rest of the stem's, which the head binds only after the
    /// forward.
    pub(super) fn embed_on_host(
        &mut self,
        slot: usize,
        inputs: &[Tensor<B, 2, Int>],
    ) -> Result<Vec<Tensor<B, 3>>, EngineError> {
        let tokens: Vec<Vec<i64>> = inputs
            .iter()
            .map(|x| x.to_data().iter::<i64>().collect())
            .collect();
        self.take_back(0);
        let table = &self.store.groups[0].slots[slot];
        let (range, [rows, width]) = (table.range(), [table.shape[0], table.shape[1]]);
        // Before any update: a bad batch leaves the step's update deferred whole.
        for tokens in &tokens {
            check_tokens(tokens, rows).map_err(|bad| token_error(bad, rows))?;
        }
        // 8-bit moments are quantised in blocks from the stem's start: the
        // table's rows can be updated apart only where they are whole blocks.
        let rows_apart = !self.config.eight_bit_moments
            || (range.start % QUANT_BLOCK == 0 && width % QUANT_BLOCK == 0);
        if !rows_apart {
            if let Some(update) = self.deferred.take() {
                self.hand_out(update, Part::Whole);
                self.take_back(0);
            }
        }
        let deferred = self.deferred.take().map(|update| {
            let mut picked = vec![false; rows];
            for &t in tokens.iter().flatten() {
                picked[t as usize] = true;
            }
            let read = TableRows {
                range: range.clone(),
                width,
                picked,
            };
            let job = self.update_job(update, Part::Picked(read.clone()));
            self.run_here(0, true, job);
            (update, read)
        });
        let table = &self.store.groups[0].params.as_slice()[range];
        let mut picked = Vec::with_capacity(inputs.len());
        for (d, tokens) in tokens.iter().enumerate() {
            let lookup = TokenRows::new(tokens, rows);
            let lane = &mut self.lanes[d];
            let rows_read = lane.pager.upload_filled::<B, _>(
                [1, lookup.rows.len(), width],
                &lane.device,
                |out| gather_rows(table, width, &lookup.rows, out),
            );
            let failed = rows_read.is_err();
            picked.push((lookup, rows_read));
            if failed {
                break;
            }
        }
        // The rest of the update is handed out whatever the lookup returned:
        // a partial update must not be left behind.
        if let Some((update, read)) = deferred {
            self.hand_out(update, Part::Rest(read));
        }
        let dtype = self.config.compute.dtype();
        let mut embedded = Vec::with_capacity(inputs.len());
        for (d, (lookup, rows_read)) in picked.into_iter().enumerate() {
            let rows_read = rows_read.map_err(|bad| token_error(bad, rows))?;
            // Landed before block 0's weights are copied, which wait for its
            // update: one span of copy time each, no idle gap between them
            // counted as copying.
            let lane = &mut self.lanes[d];
            lane.pager.ready::<B>(&lane.device);
            let [batch, seq] = inputs[d].dims();
            let distinct = lookup.rows.len();
            let index = Tensor::<B, 1, Int>::from_data(
                TensorData::new(lookup.index, [batch * seq]),
                &lane.device,
            );
            let rows_read = cast_to(rows_read.reshape([distinct, width]), dtype);
            embedded.push(rows_read.select(0, index).reshape([batch, seq, width]));
        }
        Ok(embedded)
    }

    /// Hands the head's gradients (the stem's, but for the table at stem slot
    /// `slot`) to the host worker, which writes them into the store's
    /// gradient buffer while the blocks' backward runs: over it for the first
    /// micro-batch (the table's slot zeroed, unless the head also reads it),
    /// added for the others. The last micro-batch measures the squared norm
    /// of every slot but the table's, which phase 4 completes
    /// ([`Engine::add_embedding_grads_in_store`]).
    pub(super) fn fold_head_grads(
        &mut self,
        slot: usize,
        head_grads: PendingGradients<DeviceTransfer>,
        sink: &Sink,
    ) {
        let table = self.store.groups[0].slots[slot].range();
        self.fold_into_store(0, head_grads, sink, table);
    }

    /// Phase 4 after [`Engine::fold_head_grads`]: adds `dy`'s rows into the
    /// rows of their tokens in the table's slot of the store's gradient
    /// buffer and, for the last micro-batch, the slot's squared norm to the
    /// sink's. No stem-sized copy on the way to the optimizer, only `dy`.
    pub(super) fn add_embedding_grads_in_store(
        &mut self,
        slot: usize,
        inputs: &Tensor<B, 2, Int>,
        dy: Tensor<B, 3>,
        sink: &Sink,
        lane: usize,
    ) -> Result<(), EngineError> {
        let (tokens, dy) = self.embedding_rows(slot, inputs, dy, lane);
        self.mark("dy read");
        self.settle(0);
        let started = Instant::now();
        let group = &mut self.store.groups[0];
        let table = &group.slots[slot];
        let grads = &mut group
            .grads
            .as_mut()
            .and_then(GradBuffer::f32_mut)
            .expect("an f32 gradient buffer (the stem's)")[table.range()];
        let added = self
            .table_touch
            .scatter(grads, table.shape.as_slice(), &tokens, &dy);
        if let (Ok(()), Sink::Accumulate { last: true, .. }) = (&added, sink) {
            let table_sum_sq = self.table_touch.sum_sq(grads, table.shape[1]);
            self.add_sum_sq(0, table_sum_sq);
        }
        self.split.optimizer_s += started.elapsed().as_secs_f64();
        self.dy_buffer = dy.into_buffer();
        added
    }

    /// The token ids of `inputs` and `dy` (the embedding's output gradient)
    /// on the host, in `dy_buffer`'s allocation, which the caller puts back:
    /// on CUDA, with every token in the table at stem slot `slot`, only
    /// `dy`'s sums per segment of a token's positions (`host::lookup`);
    /// elsewhere its rows.
    pub(super) fn embedding_rows(
        &mut self,
        slot: usize,
        inputs: &Tensor<B, 2, Int>,
        dy: Tensor<B, 3>,
        lane: usize,
    ) -> (Vec<i64>, LookupGrads) {
        let tokens: Vec<i64> = inputs.to_data().iter::<i64>().collect();
        let mut buffer = std::mem::take(&mut self.dy_buffer);
        let table_rows = self.store.groups[0].slots[slot].shape[0];
        if check_tokens(&tokens, table_rows).is_ok() {
            let rows = TokenRows::new(&tokens, table_rows);
            if let Some(sums) = segment_sums(&dy, &rows) {
                buffer.resize(sums.shape().num_elements(), 0.0);
                self.lanes[lane].pager.read_into(sums, &mut buffer);
                return (tokens, LookupGrads::Sums(rows, buffer));
            }
        }
        buffer.resize(dy.shape().num_elements(), 0.0);
        self.lanes[lane].pager.read_into(dy, &mut buffer);
        (tokens, LookupGrads::Positions(buffer))
    }

    /// Phase 4 on `lane` where `embed` is a lookup in the table at stem
    /// slot `slot`: `out` gets the head's gradients, when given, every slot
    /// written over, and the table's gradient adds `dy`'s rows into the rows
    /// of their tokens, on the host. The stem is not bound and no table-sized
    /// gradient crosses the bus, only `dy`.
    pub(super) fn embedding_grads_on_host(
        &mut self,
        slot: usize,
        inputs: &Tensor<B, 2, Int>,
        dy: Tensor<B, 3>,
        head_grads: Option<PendingGradients<DeviceTransfer>>,
        out: &mut [f32],
        lane: usize,
    ) -> Result<(), EngineError> {
        let (tokens, dy) = self.embedding_rows(slot, inputs, dy, lane);
        if let Some(head_grads) = head_grads {
            head_grads.finish(out, false);
        }
        let table = &self.store.groups[0].slots[slot];
        let added = self.table_touch.scatter(
            &mut out[table.range()],
            table.shape.as_slice(),
            &tokens,
            &dy,
        );
        self.dy_buffer = dy.into_buffer();
        added
    }

    /// Phase 4 on `lane` where burn differentiates `embed` (in f32, see
    /// `bind_stem`) with the stem bound on the device: `out` gets the head's
    /// gradients, when given, every slot written over, plus the embedding's.
    pub(super) fn embedding_grads_on_device(
        &mut self,
        (inputs, documents): (&Tensor<B, 2, Int>, Option<&Documents>),
        dy: Tensor<B, 3>,
        head_grads: Option<PendingGradients<DeviceTransfer>>,
        out: &mut [f32],
        lane: usize,
    ) {
        let stem_ad = self.bind_stem::<AD<B>, _>(
            M::TrainModule::from_inner(self.template.clone()),
            true,
            true,
            lane,
        );
        let bound = &mut self.lanes[lane];
        bound.pager.ready::<B>(&bound.device);
        let tokens = Tensor::<AD<B>, 2, Int>::from_inner(inputs.clone());
        let embedded = embed_tokens(&stem_ad, tokens, documents);
        let embedded = cast_to(embedded, self.config.compute.dtype());
        let grads = (embedded * Tensor::from_inner(dy)).backward();
        // While the device runs that, the head's gradients (copied long ago)
        // go into the buffer.
        if let Some(head_grads) = head_grads {
            head_grads.finish(out, false);
        }
        self.stem_grads_to_host(&stem_ad, &grads, out, lane);
        drop(stem_ad);
        self.lanes[lane].pager.evict(0);
    }
}
