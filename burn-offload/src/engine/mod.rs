//! The block-streamed training engine (docs/ARCHITECTURE.md §2).
//!
//! A step, per micro-batch:
//! 1. **Forward, no graph.** Embed, then run block 0..L on the inner backend,
//!    binding each block's weights from the host store just before it runs and
//!    dropping them right after. Only the block inputs `x_0..x_{L-1}` are kept.
//! 2. **Head + loss in chunks** of tokens under `Autodiff`, so `tokens × vocab`
//!    logits never exist at once; each chunk's backward yields its slice of
//!    `dL/dx_L` and adds to the head's parameter gradients.
//! 3. **Backward, one block at a time,** L-1..0: recompute block i under
//!    `Autodiff` from its checkpoint, seed it with the incoming gradient
//!    (`(y ⊙ dy).backward()`: the seed of ones hands `dy` to `y`), take
//!    `dx_i` and the block's parameter gradients; the gradients go to the
//!    host at once and the graph is dropped.
//! 4. **Embedding backward** from `dx_0`: on the host, as a scatter-add of
//!    its rows (on CUDA, of its rows' sums per token, formed on the device:
//!    `host::lookup`), where the model's `embed` is a plain table lookup
//!    ([`BlockModel::embedding_table`]); otherwise burn differentiates `embed`
//!    with the stem bound on the device. With the host worker and a lookup,
//!    the head's gradients were folded into the store during step 3, so this
//!    step is only `dy`'s copy and the scatter: it lies on the path from the
//!    last block's backward to the next step's first kernel, where the device
//!    idles.
//!
//! With [`EngineConfig::kept_graphs`] = k, the last k blocks run step 1 under
//! `Autodiff` and keep their graphs on the device through step 2, and step 3
//! seeds those graphs directly: a GPU with memory to spare skips k of the L
//! recomputes.
//!
//! Then the optimizer runs over the host slabs. By default (not fused, overlap
//! on) the host work runs on a **worker thread** (`host::worker`), never on the
//! thread that submits kernels: each block's gradients are folded into the
//! buffer there while the device runs the next block's backward, and at the
//! end of the step every group is lent to it for its update, in the order the
//! next forward binds them. A bind takes its group back (waiting only if the
//! worker has not got that far), so the update is **deferred** to the next
//! step and overlaps its forward. Where `embed` is a table lookup, that
//! forward embeds on the host (the table's rows gathered and uploaded, the
//! stem not bound) and hands the update out itself: first the rows it reads
//! are updated, on its own thread, then the blocks and the rest of the stem
//! go to the worker (`Engine::deferred`, `ledger`). Everything that reads the store takes every
//! group back first. With overlap off (the bench's serialised baseline) the
//! same work runs inline, the update right after the backward. In **fused** mode each block is
//! updated as soon as its gradient arrives and no gradient buffer exists (12
//! host bytes/param instead of 16). Global-norm clipping needs the norm before
//! the first update, so fused mode with clipping runs the backward twice: a
//! first pass only measures the norm, the second applies the clipped updates.
//! Fused mode cannot accumulate micro-batches (there is nowhere to accumulate).
//!
//! **Several devices** (data parallel, [`Engine::on_devices`]): each device
//! is a *lane* that runs the same phases on its own micro-batch, in lockstep
//! from the one thread that drives them all (burn's autodiff must not
//! differentiate on two threads at once). Every lane binds each block from
//! the one host store; a block's gradients are summed across the lanes on
//! the devices ([`crate::transfer::Transfer::reduce`]: NCCL on CUDA), and one
//! lane, taking turns by block, sends the sum to the host, which folds and
//! updates it once. N lanes on N micro-batches compute what one device does
//! on them as one batch.
//!
//! The files follow the step: `build` (an engine from a model or a store),
//! `lanes` (the devices), `forward` (phase 1), `head` (2), `backward` (3),
//! `embedding` (the forward's lookup and phase 4), `evaluate` (a held-out
//! loss, forward only), `sink` (where gradients
//! land), `ledger` (groups lent to the worker, deferred updates), `inspect`
//! (the store, the model, checkpoints), `config` and `report`.

mod backward;
mod build;
mod config;
mod embedding;
mod evaluate;
mod forward;
mod head;
mod inspect;
mod lanes;
mod ledger;
mod report;
mod sink;

pub use config::{BatchError, ConfigError, EngineConfig, EngineError};
pub use report::{StepReport, StepSplit};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::{HasAutodiffModule, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor};

use crate::host::norm::clip_scale;
use crate::host::optim::check_lr;
use crate::host::processes::ProcessGroup;
use crate::host::worker::HostWorker;
use crate::ops::cross_entropy::kept_targets;
use crate::store::{Bf16Weights, HostStore, Member};
use crate::transfer::{on_device, PagerStats};
use crate::{BlockModel, DecoderBlock, Documents};
use embedding::TableTouch;
use lanes::Lane;
use ledger::{Lent, Update};
use sink::Sink;

use crate::device::DeviceTransfer;

type AD<B> = Autodiff<B>;

/// What the engine needs of a model: its blocks and the model itself have
/// `Autodiff` counterparts that are a block and a model again. Implemented
/// for every [`BlockModel`] whose `Autodiff` versions are ones.
pub trait StreamedModel<B: Backend>:
    BlockModel<B, Block: HasAutodiffModule<AD<B>, TrainModule: DecoderBlock<AD<B>>>>
    + HasAutodiffModule<AD<B>, TrainModule: BlockModel<AD<B>>>
{
}

impl<B, M> StreamedModel<B> for M
where
    B: Backend,
    M: BlockModel<B, Block: HasAutodiffModule<AD<B>, TrainModule: DecoderBlock<AD<B>>>>
        + HasAutodiffModule<AD<B>, TrainModule: BlockModel<AD<B>>>,
{
}

/// A model's block type on `Autodiff<B>`.
type BlockAd<B, M> = <<M as BlockModel<B>>::Block as HasAutodiffModule<AD<B>>>::TrainModule;

/// Token ids `(inputs, targets)`, each `[batch, seq]`; a negative target
/// ([`crate::ops::cross_entropy::IGNORE_INDEX`]) takes no part in the loss.
pub type MicroBatch<B> = (Tensor<B, 2, Int>, Tensor<B, 2, Int>);

/// One round of micro-batches (one per lane) with each lane's token weight.
type Round<'a, B> = (&'a [MicroBatch<B>], Vec<Tensor<B, 1>>);

/// Each micro-batch's document boundaries (`None`: one document a row).
type BatchDocuments<'a> = Option<&'a [Documents]>;

/// The boundaries of micro-batch `i`, where they split some row.
fn documents_of(documents: BatchDocuments<'_>, i: usize) -> Option<&Documents> {
    documents.map(|d| &d[i]).filter(|d| !d.is_whole())
}

/// `model`'s embedding of `tokens`, within `documents` where given.
fn embed_tokens<X: Backend, T: BlockModel<X>>(
    model: &T,
    tokens: Tensor<X, 2, Int>,
    documents: Option<&Documents>,
) -> Tensor<X, 3> {
    match documents {
        Some(documents) => model.embed_in(tokens, documents),
        None => model.embed(tokens),
    }
}

/// The weight of each trained token in a step, on each of `devices`: one
/// over the number of targets, not ignored, of all its micro-batches (at
/// least one), so the step's loss is the mean over the tokens it trains on.
/// For one lane (`lanes`), on the device: no host round trip. Across
/// several, each micro-batch's count is read on its own device and the
/// weight is uploaded to each.
fn token_weights<B: Backend>(
    micro_batches: &[MicroBatch<B>],
    devices: &[B::Device],
    lanes: usize,
) -> Vec<Tensor<B, 1>> {
    let first = &devices[0];
    if lanes == 1 && micro_batches.iter().all(|(_, t)| t.device() == *first) {
        let weight = micro_batches
            .iter()
            .map(|(_, targets)| kept_targets(targets))
            .reduce(|a, b| a + b)
            .expect("checked: at least one micro-batch")
            .clamp_min(1.0)
            .recip();
        return vec![weight];
    }
    let kept: f64 = micro_batches
        .iter()
        .map(|(_, targets)| kept_targets(targets).into_scalar().elem::<f64>())
        .sum();
    let weight = (1.0 / kept.max(1.0)) as f32;
    devices
        .iter()
        .map(|device| Tensor::from_data(burn::tensor::TensorData::new(vec![weight], [1]), device))
        .collect()
}

/// Trains a [`BlockModel`] whose parameters live in a [`HostStore`].
pub struct Engine<B: Backend, M: BlockModel<B>> {
    /// Stateless template: the model with every parameter a zero-cost placeholder.
    template: M,
    /// Parameters inside blocks (skipped when binding the stem).
    block_ids: HashSet<ParamId>,
    /// Parameter id → (group, trained or frozen slot) for export and inspection.
    slot_of: HashMap<ParamId, (usize, Member)>,
    /// The stem slot of the token-embedding table, where the model's `embed`
    /// is a plain lookup in it ([`BlockModel::embedding_table`]): its gradient
    /// is then formed on the host.
    embedding_slot: Option<usize>,
    /// The devices, each with its copy books; lane 0's pager holds the
    /// page-locked slabs. Declared before `store`: the pager unlocks them
    /// before they are freed.
    lanes: Vec<Lane<B>>,
    store: HostStore,
    /// bf16 copies of the parameters, the weights uploaded in bf16 mode.
    bf16: Option<Bf16Weights>,
    config: EngineConfig,
    /// Optimizer updates applied so far.
    updates: u64,
    /// The current step's time split.
    split: StepSplit,
    /// Host buffer for one group's gradients on their way to the optimizer,
    /// kept across steps: a fresh one would fault in its pages every step
    /// (half a gigabyte for the 0.85B Llama's stem).
    grad_buffer: Vec<f32>,
    /// Host copy of the embedding's output gradient (see
    /// [`BlockModel::embedding_table`]), kept across steps for the same reason.
    dy_buffer: Vec<f32>,
    /// Parameters in the store (counted once: lent groups hold empty slabs).
    num_params: usize,
    /// The step's update, not yet handed to the worker (overlap mode, with a
    /// lookup embedding): the next forward first updates only the table rows
    /// it reads, on this thread, looks them up on the host, and then hands
    /// the worker every block's update and the rest of the stem's. The next
    /// step so starts without waiting for the stem's whole update and its
    /// upload, and nothing else holds the cores meanwhile (lent first, the
    /// blocks' updates would delay that lookup). Anything else that takes a group back hands them all out
    /// first, the stem's whole ([`Engine::settle`]).
    deferred: Option<Update>,
    /// The table rows the step's embedding gradients wrote (lookup embedding).
    table_touch: TableTouch,
    /// Squared norm of each group's accumulated gradient, as measured (on
    /// the worker, collected as groups come back, or here); summed in group
    /// order, so the total does not depend on which thread measured what.
    group_sum_sq: Vec<f64>,
    /// The run's processes, when this engine is one of several (one device
    /// each, its own store): every gradient sum, the embedding's output
    /// gradients and the loss cross between them ([`Engine::join_processes`]).
    processes: Option<Arc<ProcessGroup>>,
    /// The thread that runs the host work in overlap mode (not fused). Last,
    /// so it is dropped last: the pager unlocks the slabs lent to it while
    /// they are still allocated.
    worker: Option<HostWorker<Lent>>,
}

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// One optimizer step over `micro_batches` of `(inputs, targets)`, each
    /// `[batch, seq]`; their gradients are averaged (gradient accumulation).
    /// The step is the phases it is: the loss and the gradient's squared
    /// norm (phases 1–4, `forward_backward`, per micro-batch), the clipping
    /// factor from that norm, then the update.
    pub fn step(
        &mut self,
        micro_batches: &[MicroBatch<B>],
        lr: f64,
    ) -> Result<StepReport, EngineError> {
        self.step_with(micro_batches, None, lr)
    }

    /// [`Engine::step`] on packed windows: `documents[i]` holds the
    /// document boundaries of micro-batch `i`'s rows, and no position sees
    /// or is positioned by another document ([`DecoderBlock::forward_in`]).
    pub fn step_in(
        &mut self,
        micro_batches: &[MicroBatch<B>],
        documents: &[Documents],
        lr: f64,
    ) -> Result<StepReport, EngineError> {
        self.step_with(micro_batches, Some(documents), lr)
    }

    fn step_with(
        &mut self,
        micro_batches: &[MicroBatch<B>],
        documents: BatchDocuments<'_>,
        lr: f64,
    ) -> Result<StepReport, EngineError> {
        check_lr(lr)?;
        self.check_batches(micro_batches)?;
        self.check_documents(micro_batches, documents)?;
        if self.config.fused && micro_batches.len() > self.run_lanes() {
            return Err(ConfigError::FusedAccumulation.into());
        }
        self.split = StepSplit::default();
        let tokens = micro_batches
            .iter()
            .map(|(x, _)| x.dims()[0] * x.dims()[1])
            .sum();
        let step = self.updates + 1;
        let fused = self.config.fused;
        // Fused mode's one round of micro-batches (one per lane) and its
        // token weights, for each pass.
        let fused_round = fused.then(|| (micro_batches, self.token_weights(micro_batches)));
        if fused && self.config.grad_clip.is_none() && !self.config.skip_non_finite {
            // Nothing needs the norm first: one pass applies each block's
            // update as its gradient arrives.
            let mut update = Sink::Update {
                step,
                lr,
                scale: 1.0,
            };
            let loss = self.fused_pass(fused_round.as_ref(), documents, &mut update)?;
            self.updates = step;
            return Ok(self.report(loss, f64::NAN, 1.0, tokens, false));
        }
        // The loss and the squared norm: accumulated into the gradient
        // buffer, or (fused, no buffer) from a pass that only measures.
        let (loss, sum) = if fused {
            let mut norm = Sink::Norm(0.0);
            let loss = self.fused_pass(fused_round.as_ref(), documents, &mut norm)?;
            let Sink::Norm(sum) = norm else {
                unreachable!("the sink stays a norm sink")
            };
            (loss, sum)
        } else {
            self.accumulate(micro_batches, documents)?
        };
        // Fused mode cannot take back a non-finite update it has applied.
        if (fused || self.config.skip_non_finite) && !(loss.is_finite() && sum.is_finite()) {
            return Ok(self.report(loss, sum.sqrt(), 0.0, tokens, true));
        }
        let (norm, scale) = clip_scale(sum.sqrt(), self.config.grad_clip);
        if fused {
            let mut update = Sink::Update {
                step,
                lr,
                scale: scale as f32,
            };
            self.fused_pass(fused_round.as_ref(), documents, &mut update)?;
        } else {
            self.update_all(step, lr, scale as f32);
            self.mark("updates handed out");
        }
        self.updates = step;
        Ok(self.report(loss, norm, scale, tokens, false))
    }

    /// Phases 1–4 of fused mode's one round of micro-batches (with their
    /// token weights) into `sink`.
    fn fused_pass(
        &mut self,
        round: Option<&Round<'_, B>>,
        documents: BatchDocuments<'_>,
        sink: &mut Sink,
    ) -> Result<f32, EngineError> {
        let (batches, weights) = round.expect("fused mode");
        self.forward_backward(batches, documents, weights, sink)
    }

    /// The step's token weights, one per lane.
    fn token_weights(&self, micro_batches: &[MicroBatch<B>]) -> Vec<Tensor<B, 1>> {
        let devices: Vec<B::Device> = self.lanes.iter().map(|l| l.device.clone()).collect();
        token_weights(micro_batches, &devices, self.run_lanes())
    }

    /// The step's report, with its time split.
    fn report(
        &self,
        loss: f32,
        grad_norm: f64,
        clip_scale: f64,
        tokens: usize,
        skipped: bool,
    ) -> StepReport {
        StepReport {
            loss,
            grad_norm,
            clip_scale,
            tokens,
            skipped,
            split: self.split,
        }
    }

    /// Writes the mean gradient of the micro-batches into the gradient buffer
    /// (over its old contents); returns the mean loss. Non-fused mode only.
    pub fn accumulate_gradients(
        &mut self,
        micro_batches: &[MicroBatch<B>],
    ) -> Result<f32, EngineError> {
        self.accumulate_gradients_with(micro_batches, None)
    }

    /// [`Engine::accumulate_gradients`] on packed windows, `documents[i]`
    /// the boundaries of micro-batch `i` (see [`Engine::step_in`]).
    pub fn accumulate_gradients_in(
        &mut self,
        micro_batches: &[MicroBatch<B>],
        documents: &[Documents],
    ) -> Result<f32, EngineError> {
        self.accumulate_gradients_with(micro_batches, Some(documents))
    }

    fn accumulate_gradients_with(
        &mut self,
        micro_batches: &[MicroBatch<B>],
        documents: BatchDocuments<'_>,
    ) -> Result<f32, EngineError> {
        if self.config.fused {
            return Err(ConfigError::FusedGradients.into());
        }
        Ok(self.accumulate(micro_batches, documents)?.0)
    }

    /// [`Engine::accumulate_gradients`], also returning the squared norm of
    /// the accumulated gradient: the last round measures each group as it
    /// lands, while the device computes the next block, rather than in a
    /// pass over the whole buffer after the backward. The micro-batches run
    /// in rounds of one per lane.
    pub(super) fn accumulate(
        &mut self,
        micro_batches: &[MicroBatch<B>],
        documents: BatchDocuments<'_>,
    ) -> Result<(f32, f64), EngineError> {
        self.check_batches(micro_batches)?;
        self.check_documents(micro_batches, documents)?;
        let rounds = micro_batches.len() / self.run_lanes();
        if self.config.compute_precision_gradients && rounds > 1 {
            return Err(ConfigError::CompactAccumulation.into());
        }
        let weights = self.token_weights(micro_batches);
        let mut loss = 0.0;
        self.group_sum_sq = vec![0.0; self.store.groups.len()];
        let lanes = self.run_lanes();
        for (r, round) in micro_batches.chunks(lanes).enumerate() {
            let mut sink = Sink::Accumulate {
                first: r == 0,
                last: r + 1 == rounds,
            };
            let documents = documents.map(|d| &d[r * lanes..(r + 1) * lanes]);
            loss += self.forward_backward(round, documents, &weights, &mut sink)?;
        }
        self.mark("loss read");
        // The worker's share of the norm comes back with its groups.
        self.settle_all();
        self.mark("gradients settled");
        Ok((loss, self.group_sum_sq.iter().sum()))
    }

    /// Boundaries, where given, one per micro-batch and of its shape.
    fn check_documents(
        &self,
        micro_batches: &[MicroBatch<B>],
        documents: BatchDocuments<'_>,
    ) -> Result<(), EngineError> {
        let Some(documents) = documents else {
            return Ok(());
        };
        if documents.len() != micro_batches.len() {
            return Err(BatchError::Documents {
                micro_batches: micro_batches.len(),
                documents: documents.len(),
            }
            .into());
        }
        for (index, ((x, _), d)) in micro_batches.iter().zip(documents).enumerate() {
            if d.dims() != x.dims() {
                return Err(BatchError::DocumentShape {
                    index,
                    documents: d.dims(),
                    inputs: x.dims(),
                }
                .into());
            }
        }
        Ok(())
    }

    pub(super) fn check_batches(&self, micro_batches: &[MicroBatch<B>]) -> Result<(), EngineError> {
        if micro_batches.is_empty() {
            return Err(BatchError::NoMicroBatches.into());
        }
        let lanes = self.run_lanes();
        if !micro_batches.len().is_multiple_of(lanes) {
            return Err(BatchError::Lanes {
                micro_batches: micro_batches.len(),
                lanes,
            }
            .into());
        }
        let first = micro_batches[0].0.dims();
        for (index, (x, y)) in micro_batches.iter().enumerate() {
            let (inputs, targets) = (x.dims(), y.dims());
            if inputs != targets {
                return Err(BatchError::TargetShape {
                    index,
                    inputs,
                    targets,
                }
                .into());
            }
            if inputs != first {
                return Err(BatchError::Uneven {
                    index,
                    shape: inputs,
                    first,
                }
                .into());
            }
            if inputs[0] == 0 || inputs[1] == 0 {
                return Err(BatchError::Empty {
                    index,
                    shape: inputs,
                }
                .into());
            }
        }
        Ok(())
    }

    /// Phases 1–4 for one round of micro-batches, one per lane, in
    /// lockstep; parameter gradients of `weight ×` the sum of their tokens'
    /// losses go to `sink`, summed over the lanes. Returns that weighted sum:
    /// with [`token_weights`], the round's share of the step's mean.
    ///
    /// The next block is always bound before the current one runs (prefetch;
    /// on a GPU its copy overlaps the current block's compute), so at most two
    /// blocks are resident on a device. The stem is resident only while it is used.
    fn forward_backward(
        &mut self,
        round: &[MicroBatch<B>],
        documents: BatchDocuments<'_>,
        weights: &[Tensor<B, 1>],
        sink: &mut Sink,
    ) -> Result<f32, EngineError> {
        // Placeholder templates: cloning them copies no weights.
        let blocks = self.template.blocks().to_vec();
        let copies = self.pager_stats();
        // Each of this engine's lanes' tokens on its device.
        let first = self.first_lane();
        let (inputs, targets): (Vec<_>, Vec<_>) = round[first..first + self.lanes.len()]
            .iter()
            .zip(&self.lanes)
            .map(|((x, y), lane)| {
                (
                    on_device(x.clone(), &lane.device),
                    on_device(y.clone(), &lane.device),
                )
            })
            .unzip();
        // Every lane's tokens of the run, for the embedding's backward: with
        // processes, each adds every lane's rows to its own store.
        let run_inputs: Vec<_> = match self.processes {
            Some(_) => round
                .iter()
                .map(|(x, _)| on_device(x.clone(), &self.lanes[0].device))
                .collect(),
            None => inputs.clone(),
        };
        // Each lane's boundaries, and the run's lanes' (as `run_inputs`).
        let lane_documents: Vec<Option<&Documents>> = (first..first + self.lanes.len())
            .map(|i| documents_of(documents, i))
            .collect();
        let run_documents: Vec<Option<&Documents>> = match self.processes {
            Some(_) => (0..round.len())
                .map(|i| documents_of(documents, i))
                .collect(),
            None => lane_documents.clone(),
        };

        // 1. Forward: keep the block inputs, no graph (but the kept blocks').
        let phase = Instant::now();
        let forward = self.stream_forward(&blocks, &inputs, &lane_documents, true)?;
        let first_kept = blocks.len() - forward[0].1.graphs.len();
        self.split.forward_s += phase.elapsed().as_secs_f64();
        let copies = self.split_copies(copies, true);
        self.mark("forward done");
        // Every block was bound above, so no update is left but, after a host
        // embedding, the rest of the stem's; the backward writes over the
        // gradients a deferred update reads.
        self.settle_all();

        // 2. Head and loss in chunks of positions.
        let phase = Instant::now();
        let (x, states): (Vec<_>, Vec<_>) = forward.into_iter().unzip();
        let head = self.head(&blocks, first_kept, x, &targets, weights, sink)?;
        self.split.head_s += phase.elapsed().as_secs_f64();
        self.mark("head and loss done");

        // 3. Backward, one block at a time, recomputed from its checkpoint.
        let phase = Instant::now();
        let dx_0 = self.backward(
            &blocks,
            states,
            &lane_documents,
            head.next,
            head.dy,
            head.beside,
            sink,
        )?;
        let dx_0 = self.gather_lanes(dx_0)?;
        self.split.backward_s += phase.elapsed().as_secs_f64();

        // 4. Embedding backward from dx_0, added to the head's gradients.
        let phase = Instant::now();
        self.embedding_backward(&run_inputs, &run_documents, dx_0, head.grads, sink)?;
        self.split.head_s += phase.elapsed().as_secs_f64();
        self.split_copies(copies, false);
        self.mark("embedding backward done");

        let weighted = head
            .loss_sums
            .into_iter()
            .zip(weights)
            .map(|(sum, weight)| match sum {
                Some(sum) => sum * weight.clone(),
                None => Tensor::zeros([1], &weight.device()),
            })
            .collect();
        Ok(self.run_loss(weighted)? as f32)
    }

    /// Adds the copies timed since `since` to the step's split (as the
    /// forward's with `forward`); returns the counters now.
    fn split_copies(&mut self, since: PagerStats, forward: bool) -> PagerStats {
        let now = self.pager_stats();
        self.split.add_copies(&since, &now, forward);
        now
    }
}
