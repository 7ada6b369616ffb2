//! The block-streamed training engine (DESIGN.md §1).
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
//!    `crate::lookup`), where the model's `embed` is a plain table lookup
//!    ([`BlockModel::embedding_table`]); otherwise burn differentiates `embed`
//!    with the stem bound on the device. With the host worker and a lookup,
//!    the head's gradients were folded into the store during step 3, so this
//!    step is only `dy`'s copy and the scatter: it lies on the path from the
//!    last block's backward to the next step's first kernel, where the device
//!    idles (run23: ~90 ms of a 1.85 s step before).
//!
//! With [`EngineConfig::kept_graphs`] = k, the last k blocks run step 1 under
//! `Autodiff` and keep their graphs on the device through step 2, and step 3
//! seeds those graphs directly: a GPU with memory to spare skips k of the L
//! recomputes.
//!
//! Then the optimizer runs over the host slabs. By default (not fused, overlap
//! on) the host work runs on a **worker thread** (`crate::worker`), never on the
//! thread that submits kernels: each block's gradients are folded into the
//! buffer there while the device runs the next block's backward, and at the
//! end of the step every group is lent to it for its update, in the order the
//! next forward binds them. A bind takes its group back (waiting only if the
//! worker has not got that far), so the update is **deferred** to the next
//! step and overlaps its forward. Where `embed` is a table lookup, that
//! forward embeds on the host (the table's rows gathered and uploaded, the
//! stem not bound) and hands the update out itself: first the rows it reads
//! are updated, on its own thread, then the blocks and the rest of the stem
//! go to the worker (`Engine::deferred`). Everything that reads the store takes every
//! group back first. With overlap off (the bench's serialised baseline) the
//! same work runs inline, the update right after the backward. In **fused** mode each block is
//! updated as soon as its gradient arrives and no gradient buffer exists (12
//! host bytes/param instead of 16). Global-norm clipping needs the norm before
//! the first update, so fused mode with clipping runs the backward twice: a
//! first pass only measures the norm, the second applies the clipped updates.
//! Fused mode cannot accumulate micro-batches (there is nowhere to accumulate).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::{AutodiffModule, HasAutodiffModule, Module, ModuleMapper, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, ElementConversion, Int, Tensor, TensorData};
use rayon::prelude::*;

use crate::checkpoint::{self, CheckpointError};
use crate::copy_window;
use crate::cross_entropy::{kept_targets, nll_sum};
use crate::lookup::TokenRows;
use crate::optim::{check_lr, sum_of_squares, OptimizerConfig, OptimizerError, Rows, UpdateSlices};
use crate::pager::{
    add_to, check_tokens, gather_rows, DeviceGrads, Pager, PagerStats, PendingGradients, Stash,
    ToPlaceholders,
};
use crate::precision::{cast_to, Bf16Weights, Compute};
use crate::store::{Collect, HostStore, StoreError, StoreLayout};
use crate::trace;
use crate::worker::{HostWorker, Job, Lent};
use crate::{BlockModel, DecoderBlock};

type AD<B> = Autodiff<B>;

/// A model's block type on `Autodiff<B>`.
type BlockAd<B, M> = <<M as BlockModel<B>>::Block as HasAutodiffModule<AD<B>>>::TrainModule;

/// Token ids `(inputs, targets)`, each `[batch, seq]`; a negative target
/// ([`crate::cross_entropy::IGNORE_INDEX`]) takes no part in the loss.
pub type MicroBatch<B> = (Tensor<B, 2, Int>, Tensor<B, 2, Int>);

/// The weight of each trained token in a step: one over the number of
/// targets, not ignored, of all its micro-batches (at least one), so the
/// step's loss is the mean over the tokens it trains on. On the device: no
/// host round trip.
fn token_weight<B: Backend>(micro_batches: &[MicroBatch<B>]) -> Tensor<B, 1> {
    micro_batches
        .iter()
        .map(|(_, targets)| kept_targets(targets))
        .reduce(|a, b| a + b)
        .expect("checked: at least one micro-batch")
        .clamp_min(1.0)
        .recip()
}

/// A block whose forward kept its graph: the bound block, its input
/// (requiring a gradient) and its output, for a backward with no recompute.
type KeptGraph<B, M> = (BlockAd<B, M>, Tensor<AD<B>, 3>, Tensor<AD<B>, 3>);

/// A block bound for the forward: graph-free, or under `Autodiff` when its
/// graph is kept for the backward.
enum ForwardBlock<P, A> {
    Plain(P),
    Graph(A),
}

/// What the forward leaves for the backward: a checkpoint per recomputed
/// block, then the kept graphs of the last blocks.
struct ForwardState<B: Backend, M: BlockModel<B>>
where
    M::Block: HasAutodiffModule<AD<B>>,
{
    checkpoints: Vec<Stash<B>>,
    graphs: Vec<KeptGraph<B, M>>,
}

/// How the engine trains.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub optimizer: OptimizerConfig,
    /// Clip the global gradient norm to this value (`None`: no clipping).
    pub grad_clip: Option<f64>,
    /// Apply each block's update as soon as its gradient arrives (no gradient buffer).
    pub fused: bool,
    /// Tokens per chunk of the LM head and loss.
    pub loss_chunk_tokens: usize,
    /// Skip a step whose loss or gradients are not finite, leaving parameters
    /// and optimizer state untouched. In fused mode this needs the gradient
    /// norm before the first update, so the backward runs twice (as with clipping).
    pub skip_non_finite: bool,
    /// Overlap copies and CPU work with compute (the pipeline). `false` is the
    /// serialised baseline of the bench: every bind first waits for the device
    /// to go idle and then for its copies, and the CPU handles a block's
    /// gradients only once the device is idle.
    pub overlap: bool,
    /// Keep block-input checkpoints in host memory on GPU backends, so device
    /// memory stays flat in depth (each costs one small copy each way).
    pub host_checkpoints: bool,
    /// The precision the device computes in; the host state stays f32.
    pub compute: Compute,
    /// Blocks, counted back from the last, whose forward runs under
    /// `Autodiff` and keeps its graph on the device until the backward, which
    /// then seeds it directly instead of recomputing the block from its
    /// checkpoint. Each costs one block's saved activations of device memory
    /// for the whole step (and keeps its weights bound); 0 recomputes every
    /// block. A GPU with memory to spare trades it for the recompute.
    pub kept_graphs: usize,
    /// On CUDA, have threads that wait for the device sleep instead of
    /// spinning (the primary context's scheduling flag), leaving the cores to
    /// the host work that overlaps the device. `false` keeps the driver's
    /// default (a benchmark baseline).
    pub blocking_sync: bool,
    /// In overlap mode, have the host optimizer wait while one of the
    /// forward's weight copies is in flight, so its pass over host memory
    /// does not slow the copy (see `copy_window`). `false` lets them share
    /// host memory bandwidth.
    pub hold_updates_for_copies: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            optimizer: OptimizerConfig::AdamW(Default::default()),
            grad_clip: None,
            fused: false,
            loss_chunk_tokens: 4096,
            skip_non_finite: true,
            overlap: true,
            host_checkpoints: true,
            compute: Compute::Fp32,
            kept_graphs: 0,
            blocking_sync: true,
            hold_updates_for_copies: true,
        }
    }
}

impl EngineConfig {
    /// Checks the settings on their own and against `device` (every way of
    /// building an engine runs this one check).
    pub fn validate<B: Backend>(&self, device: &B::Device) -> Result<(), EngineError> {
        self.optimizer.validate()?;
        self.compute
            .check::<B>(device)
            .map_err(EngineError::Config)?;
        if self.loss_chunk_tokens == 0 {
            return Err(EngineError::Config(
                "loss_chunk_tokens must be at least 1".into(),
            ));
        }
        if let Some(clip) = self.grad_clip {
            if !(clip.is_finite() && clip > 0.0) {
                return Err(EngineError::Config(format!(
                    "grad_clip must be positive, got {clip}"
                )));
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Optimizer(#[from] OptimizerError),
    #[error("invalid engine config: {0}")]
    Config(String),
    #[error("bad batch: {0}")]
    Batch(String),
    #[error("block {block} returned hidden states of shape {got:?} for an input of shape {want:?}; blocks must preserve [batch, seq, d_model]")]
    Checkpoint {
        block: usize,
        got: Vec<usize>,
        want: Vec<usize>,
    },
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Mean loss over all tokens of all micro-batches.
    pub loss: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Factor the gradients were multiplied by (1 when not clipped).
    pub clip_scale: f64,
    pub tokens: usize,
    /// The loss or a gradient was not finite: nothing was updated.
    pub skipped: bool,
    /// Where the step's time went.
    pub split: StepSplit,
}

impl StepReport {
    fn skipped(loss: f32, grad_norm: f64, tokens: usize, split: StepSplit) -> Self {
        Self {
            loss,
            grad_norm,
            clip_scale: 0.0,
            tokens,
            skipped: true,
            split,
        }
    }
}

/// Where a step's wall time went, in seconds of host time, summed over
/// micro-batches and passes. The device runs behind the host, so a phase ends
/// when the host has handed its work over (or, for `backward_wait_s`, waited
/// for it). `backward_s` contains `backward_wait_s`, `download_s` and, in
/// fused mode, the part of `optimizer_s` that overlaps the backward.
///
/// The `*_bytes`/`*_copy_s` pairs are the copies timed on CUDA (zero
/// elsewhere): their ratio is the achieved rate. Uploads are timed on the copy
/// stream from a batch's first copy to its last, so gaps between copies count
/// against the rate; downloads from the copy's start to its end. A block's
/// gradients ride behind its backward on cubecl's stream, where no event
/// times them, nor the head's, which follow its last loss chunk: the timed
/// downloads are the embedding's gradients and the checkpoints'.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepSplit {
    /// Streamed forward without a graph (uploads, block compute, checkpoints).
    pub forward_s: f64,
    /// LM head and loss in chunks, and the embedding backward.
    pub head_s: f64,
    /// Recompute and backward of every block, gradients to the host.
    pub backward_s: f64,
    /// Waiting for a block's backward to finish on the device (the
    /// serialised baseline; in the pipeline the host never waits for it on
    /// its own: the wait falls into the next bind or `download_s`).
    pub backward_wait_s: f64,
    /// Host time handing blocks over in the backward: the checkpoint back,
    /// waiting for the block's weights, binding the next block (its copy).
    #[serde(default)]
    pub backward_bind_s: f64,
    /// Host time recording and submitting each block's recompute and
    /// backward (burn's autodiff graph and kernel launches), up to the flush.
    #[serde(default)]
    pub backward_launch_s: f64,
    /// Waiting for a block's gradient copies and writing them into the
    /// host buffer (fused sinks; accumulated gradients are the host
    /// worker's, or inline, and count in `optimizer_s`).
    pub download_s: f64,
    /// CPU optimizer (AdamW over the host slabs) and gradient accumulation.
    /// In the default (deferred) mode this is worker-thread time, mostly the
    /// previous step's update, which overlaps this step's forward.
    pub optimizer_s: f64,
    /// Time the thread that drives the device waited for the host worker to
    /// give a group back (the part of `optimizer_s` the device may feel).
    #[serde(default)]
    pub host_wait_s: f64,
    /// Host→device copies of the forward (weights).
    pub forward_h2d_bytes: u64,
    pub forward_h2d_copy_s: f64,
    /// Host→device copies after the forward (head, weights again, checkpoints).
    pub backward_h2d_bytes: u64,
    pub backward_h2d_copy_s: f64,
    /// Device→host copies timed on the copy stream (the embedding's gradients, host checkpoints).
    pub d2h_bytes: u64,
    pub d2h_copy_s: f64,
}

impl StepSplit {
    /// Adds the copies the pager timed between `from` and `to`; uploads count
    /// as the forward's with `forward`, else as the backward's.
    fn add_copies(&mut self, from: &PagerStats, to: &PagerStats, forward: bool) {
        let up_bytes = to.upload_timed_bytes - from.upload_timed_bytes;
        let up_s = (to.upload_copy_ns - from.upload_copy_ns) as f64 * 1e-9;
        if forward {
            self.forward_h2d_bytes += up_bytes;
            self.forward_h2d_copy_s += up_s;
        } else {
            self.backward_h2d_bytes += up_bytes;
            self.backward_h2d_copy_s += up_s;
        }
        self.d2h_bytes += to.download_timed_bytes - from.download_timed_bytes;
        self.d2h_copy_s += (to.download_copy_ns - from.download_copy_ns) as f64 * 1e-9;
    }
}

/// Where a block's gradients go once they are on the host.
enum Sink {
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

/// One optimizer update of a group, as `OptimizerConfig::update` takes it.
#[derive(Debug, Clone, Copy)]
struct Update {
    step: u64,
    lr: f64,
    scale: f32,
}

/// Which of a group's elements an update job covers: all of them, or, for
/// the stem, the rows of its embedding table that a forward reads (`Picked`),
/// then everything else (`Rest`).
enum Part {
    Whole,
    Picked(TableRows),
    Rest(TableRows),
}

/// Rows of the embedding table inside the stem's slabs.
#[derive(Clone)]
struct TableRows {
    /// The table's elements in the stem group.
    range: std::ops::Range<usize>,
    width: usize,
    /// Per table row: whether it is one of the rows.
    picked: Vec<bool>,
}

/// The embedding-table rows whose gradient a step has written, for the
/// table's squared norm: where the head leaves the table alone (no tied
/// weights), every other row of its gradient is zero, so the norm reads only
/// these (a few hundred of 32000 rows with the byte tokenizer, where reading
/// the whole table's 262 MB lay on the path to the next step).
#[derive(Default)]
struct TableTouch {
    rows: Vec<bool>,
    /// The head wrote into the table's gradient too: every row counts.
    dense: bool,
}

impl TableTouch {
    /// Starts a micro-batch whose head did (`head`) or did not write a
    /// gradient into the table of `rows` rows; the first one of a step resets.
    fn begin(&mut self, first: bool, rows: usize, head: bool) {
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
                crate::pager::scatter_add_rows(grads, shape[1], tokens, rows)
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
    fn sum_sq(&self, grads: &[f32], width: usize) -> f64 {
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
enum LookupGrads {
    /// Row `p` is position `p`'s.
    Positions(Vec<f32>),
    /// Summed per segment of a token's positions on the device (CUDA only).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
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

/// Trains a [`BlockModel`] whose parameters live in a [`HostStore`].
pub struct Engine<B: Backend, M: BlockModel<B>> {
    /// Stateless template: the model with every parameter a zero-cost placeholder.
    template: M,
    /// Parameters inside blocks (skipped when binding the stem).
    block_ids: HashSet<ParamId>,
    /// Parameter id → (group, slot) for export and inspection.
    slot_of: HashMap<ParamId, (usize, usize)>,
    /// The stem slot of the token-embedding table, where the model's `embed`
    /// is a plain lookup in it ([`BlockModel::embedding_table`]): its gradient
    /// is then formed on the host.
    embedding_slot: Option<usize>,
    /// Declared before `store`: it unlocks page-locked slabs before they are freed.
    pager: Pager,
    store: HostStore,
    /// bf16 copies of the parameters, the weights uploaded in bf16 mode.
    bf16: Option<Bf16Weights>,
    config: EngineConfig,
    device: B::Device,
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
    /// upload (run24: ~50 ms at 0.85B), and nothing else holds the cores
    /// meanwhile (lent first, the blocks' updates delayed that lookup by
    /// ~40 ms). Anything else that takes a group back hands them all out
    /// first, the stem's whole ([`Engine::settle`]).
    deferred: Option<Update>,
    /// The table rows the step's embedding gradients wrote (lookup embedding).
    table_touch: TableTouch,
    /// Squared norm of each group's accumulated gradient, as measured (on
    /// the worker, collected as groups come back, or here); summed in group
    /// order, so the total does not depend on which thread measured what.
    group_sum_sq: Vec<f64>,
    /// The thread that runs the host work in overlap mode (not fused). Last,
    /// so it is dropped last: the pager unlocks the slabs lent to it while
    /// they are still allocated.
    worker: Option<HostWorker>,
}

impl<B, M> Engine<B, M>
where
    B: Backend,
    M: BlockModel<B> + HasAutodiffModule<AD<B>>,
    M::TrainModule: BlockModel<AD<B>>,
    M::Block: HasAutodiffModule<AD<B>>,
    <M::Block as HasAutodiffModule<AD<B>>>::TrainModule: DecoderBlock<AD<B>>,
{
    /// Moves `model`'s parameters into a new host store; the engine keeps only
    /// a stateless template of the model.
    pub fn new(model: M, config: EngineConfig, device: &B::Device) -> Result<Self, EngineError> {
        // Before the weights move into the store.
        config.validate::<B>(device)?;
        let layout = StoreLayout {
            gradient_buffer: !config.fused,
        };
        let block_ids: Vec<Vec<ParamId>> = model
            .blocks()
            .iter()
            .map(|block| {
                let mut collect = Collect::new(false);
                block.visit(&mut collect);
                collect.out.into_iter().map(|p| p.id).collect()
            })
            .collect();
        // Lazily initialised weights are drawn one tensor at a time, straight
        // into the host store.
        let (template, store) = HostStore::take_from(model, &block_ids, layout)?;
        Self::with_store(template, store, config, device)
    }

    /// Pairs a model (its values are ignored) with an existing store, checking
    /// that every group has the shapes the model expects.
    pub fn with_store(
        model: M,
        store: HostStore,
        config: EngineConfig,
        device: &B::Device,
    ) -> Result<Self, EngineError> {
        config.validate::<B>(device)?;
        if store.layout.gradient_buffer == config.fused {
            return Err(EngineError::Config(format!(
                "store was built {} a gradient buffer but the engine is {}",
                if store.layout.gradient_buffer {
                    "with"
                } else {
                    "without"
                },
                if config.fused { "fused" } else { "not fused" }
            )));
        }
        let blocks = model.blocks();
        if blocks.len() != store.num_blocks() {
            return Err(StoreError::BlockCount {
                got: blocks.len(),
                want: store.num_blocks(),
            }
            .into());
        }
        let mut slot_of = HashMap::new();
        let mut block_ids = HashSet::new();
        for (i, block) in blocks.iter().enumerate() {
            let mut collect = Collect::new(false);
            block.visit(&mut collect);
            store.check_group(i + 1, collect.out.iter().map(|p| p.shape.clone()).collect())?;
            for (k, p) in collect.out.into_iter().enumerate() {
                block_ids.insert(p.id);
                slot_of.insert(p.id, (i + 1, k));
            }
        }
        let mut collect = Collect::new(false);
        model.visit(&mut collect);
        collect.out.retain(|p| !block_ids.contains(&p.id));
        store.check_group(0, collect.out.iter().map(|p| p.shape.clone()).collect())?;
        for (k, p) in collect.out.into_iter().enumerate() {
            slot_of.insert(p.id, (0, k));
        }
        // Only a 2-D stem slot can take the host's scatter-add.
        let embedding_slot = model
            .embedding_table()
            .and_then(|table| slot_of.get(&table.id))
            .and_then(|&(g, k)| (g == 0 && store.groups[0].slots[k].shape.len() == 2).then_some(k));
        let template = model.map(&mut ToPlaceholders);
        // Uploads read the parameter slabs; page-locked, they run at DMA speed.
        let mut pager = Pager::new(!config.overlap, config.host_checkpoints);
        // Host work runs on every core beside the device: waiting threads
        // must not spin (measured in run21: the GPU was busy 74% of a step).
        if config.blocking_sync {
            pager.blocking_sync::<B>(device);
        }
        let bf16 = (config.compute == Compute::Bf16).then(|| Bf16Weights::new(&store));
        // What is uploaded: the f32 slabs, or in bf16 mode the bf16 copies
        // and the stem's f32 slab (the embedding phases bind it in f32).
        let f32_groups = match &bf16 {
            Some(copies) => {
                for slab in copies.slabs() {
                    pager.pin::<B>(slab, device);
                }
                1
            }
            None => store.groups.len(),
        };
        for group in &store.groups[..f32_groups] {
            pager.pin::<B>(bytemuck::cast_slice(group.params.as_slice()), device);
        }
        // The model's weights were drawn on the device; only placeholders remain.
        pager.release_free_memory::<B>(device);
        let worker =
            (config.overlap && !config.fused).then(|| HostWorker::spawn(store.groups.len()));
        let num_params = store.num_params();
        Ok(Self {
            template,
            block_ids,
            slot_of,
            embedding_slot,
            pager,
            store,
            bf16,
            config,
            device: device.clone(),
            updates: 0,
            split: StepSplit::default(),
            grad_buffer: Vec::new(),
            dy_buffer: Vec::new(),
            num_params,
            deferred: None,
            table_touch: TableTouch::default(),
            group_sum_sq: Vec::new(),
            worker,
        })
    }

    /// The parameters and optimizer state, with every update applied.
    pub fn store(&mut self) -> &HostStore {
        self.settle_all();
        &self.store
    }

    /// Mutable access to the parameters and optimizer state (loaders,
    /// surgery), with every update applied.
    pub fn store_mut(&mut self) -> &mut HostStore {
        self.settle_all();
        if let Some(copies) = &mut self.bf16 {
            copies.mark_all_stale();
        }
        &mut self.store
    }

    /// Number of parameters (no update needs to be settled to count them).
    pub fn num_params(&self) -> usize {
        self.num_params
    }

    /// Host bytes of the compute-precision weight copies (bf16 mode; 0 otherwise).
    pub fn compute_copy_bytes(&self) -> usize {
        self.bf16.as_ref().map_or(0, Bf16Weights::bytes)
    }

    /// Parameter groups (stem, then blocks) whose update is still deferred
    /// after a step: lent to the host worker and not taken back, or, with a
    /// lookup embedding, every group until the next forward hands the update out.
    pub fn pending_groups(&self) -> usize {
        match self.deferred {
            Some(_) => self.store.groups.len(),
            None => self.worker.as_ref().map_or(0, HostWorker::away_count),
        }
    }

    /// Takes every group back from the host worker (every deferred update applied).
    pub fn settle_all(&mut self) {
        for g in 0..self.store.groups.len() {
            self.settle(g);
        }
    }

    /// Takes group `g` back from the host worker once its job is done (a no-op
    /// when it is not lent), with its deferred update applied.
    fn settle(&mut self, g: usize) {
        if let Some(update) = self.deferred.take() {
            self.hand_out(update, Part::Whole);
        }
        self.take_back(g);
    }

    /// Lends every group to the worker for `update`: the blocks in the order
    /// the forward binds them, then `stem` of the stem, which the forward
    /// reads last (the head).
    fn hand_out(&mut self, update: Update, stem: Part) {
        for g in 1..self.store.groups.len() {
            self.take_back(g);
            self.run_update(g, update, Part::Whole);
        }
        self.take_back(0);
        self.run_update(0, update, stem);
    }

    /// Whether the host worker is still running a job on group `g`.
    fn update_running(&mut self, g: usize) -> bool {
        self.worker.as_mut().is_some_and(|w| w.is_running(g))
    }

    /// Takes group `g` back from the host worker once its job is done (a no-op
    /// when it is not lent); an update not handed out stays deferred.
    fn take_back(&mut self, g: usize) {
        let Some(worker) = self.worker.as_mut().filter(|w| w.is_away(g)) else {
            return;
        };
        let waited = Instant::now();
        let back = worker.take(g);
        self.split.host_wait_s += waited.elapsed().as_secs_f64();
        self.split.optimizer_s += back.busy.as_secs_f64();
        self.add_sum_sq(g, back.sum_sq);
        self.restore_group(g, back.lent);
    }

    /// Takes group `g`'s slabs (and, with `bf16`, its bf16 copy) out of the
    /// store for a job; [`Engine::restore_group`] puts them back.
    fn lend_group(&mut self, g: usize, bf16: bool) -> Lent {
        Lent {
            slabs: self.store.groups[g].lend(),
            bf16: self.bf16.as_mut().filter(|_| bf16).map(|c| c.take(g)),
        }
    }

    /// Puts group `g`'s lent slabs (and bf16 copy) back in place.
    fn restore_group(&mut self, g: usize, lent: Lent) {
        self.store.groups[g].restore(lent.slabs);
        if let Some(slab) = lent.bf16 {
            self.bf16.as_mut().expect("bf16 copies").put(g, slab);
        }
    }

    /// Runs `job` on group `g`'s slabs (and, with `bf16`, its bf16 copy): on
    /// the host worker in overlap mode, else here and now.
    fn run_on_group(&mut self, g: usize, bf16: bool, job: Job) {
        self.settle(g);
        self.run_on_settled(g, bf16, job);
    }

    /// [`Engine::run_on_group`] on a group that is not lent, leaving an
    /// update not handed out yet deferred.
    fn run_on_settled(&mut self, g: usize, bf16: bool, job: Job) {
        if self.worker.is_some() {
            let lent = self.lend_group(g, bf16);
            self.worker
                .as_mut()
                .expect("checked above")
                .lend(g, lent, job);
            return;
        }
        self.run_here(g, bf16, job);
    }

    /// Runs `job` on group `g` (not lent) on this thread.
    fn run_here(&mut self, g: usize, bf16: bool, job: Job) {
        let started = Instant::now();
        let mut lent = self.lend_group(g, bf16);
        let sum_sq = job(&mut lent);
        self.add_sum_sq(g, sum_sq);
        self.split.optimizer_s += started.elapsed().as_secs_f64();
        self.restore_group(g, lent);
    }

    /// Starts the update of every group from the gradient buffer: deferred
    /// on the worker in overlap mode (in the order the next forward binds
    /// the groups; with a lookup embedding, handed out by that forward, see
    /// [`Engine::deferred`]), else applied at once.
    fn update_all(&mut self, step: u64, lr: f64, scale: f32) {
        let update = Update { step, lr, scale };
        if self.worker.is_some() && self.embedding_slot.is_some() {
            self.settle_all();
            self.deferred = Some(update);
            return;
        }
        for g in 0..self.store.groups.len() {
            self.run_update(g, update, Part::Whole);
        }
    }

    /// Runs `update` over `part` of group `g` ([`Engine::run_on_settled`]).
    fn run_update(&mut self, g: usize, update: Update, part: Part) {
        let job = self.update_job(g, update, part);
        self.run_on_settled(g, true, job);
    }

    /// The job that applies `update` to `part` of group `g` (its bf16 copy too).
    fn update_job(&self, g: usize, update: Update, part: Part) -> Job {
        let optimizer = self.config.optimizer;
        let len = self.store.groups[g].numel();
        Box::new(move |lent| {
            let slabs = &mut lent.slabs;
            let slices = UpdateSlices {
                params: slabs.params.as_mut_slice(),
                m: slabs.adam_m.as_mut_slice(),
                v: slabs.adam_v.as_mut_slice(),
                grads: slabs
                    .grads
                    .as_ref()
                    .expect("gradient buffer in non-fused mode")
                    .as_slice(),
                bf16: lent
                    .bf16
                    .as_mut()
                    .map(|slab| Bf16Weights::values_in(slab, len)),
            };
            let Update { step, lr, scale } = update;
            let (rows, pick) = match &part {
                Part::Whole => {
                    optimizer.update(step, lr, scale, slices);
                    return 0.0;
                }
                Part::Picked(rows) => (rows, true),
                Part::Rest(rows) => (rows, false),
            };
            let (before, rest) = slices.split_at(rows.range.start);
            let (table, after) = rest.split_at(rows.range.len());
            let picked = Rows::Picked {
                width: rows.width,
                picked: &rows.picked,
                pick,
            };
            optimizer.update_rows(step, lr, scale, table, picked);
            if !pick {
                optimizer.update(step, lr, scale, before);
                optimizer.update(step, lr, scale, after);
            }
            0.0
        })
    }

    /// Adds to group `g`'s measured squared gradient norm (no-op outside
    /// [`Engine::accumulate`], whose total it is).
    fn add_sum_sq(&mut self, g: usize, sum_sq: f64) {
        if let Some(sum) = self.group_sum_sq.get_mut(g) {
            *sum += sum_sq;
        }
    }

    /// Brings group `g`'s bf16 weights up to date (bf16 mode) before a bind.
    fn refresh_bf16(&mut self, g: usize) {
        if let Some(copies) = self.bf16.as_mut().filter(|c| c.is_stale(g)) {
            copies.refresh(g, self.store.groups[g].params.as_slice());
        }
    }

    /// Writes a checkpoint (parameters, Adam state, update count and the
    /// trainer's `state`) into `dir`, atomically, rotating the run's oldest.
    pub fn save_checkpoint(
        &mut self,
        dir: &mut checkpoint::CheckpointDir,
        state: serde_json::Value,
    ) -> Result<std::path::PathBuf, CheckpointError> {
        self.settle_all();
        dir.save(&self.store, self.updates, state)
    }

    /// Restores parameters, Adam state and the update count from a
    /// checkpoint; on any error the engine is left as it was.
    pub fn load_checkpoint(
        &mut self,
        path: &std::path::Path,
    ) -> Result<checkpoint::Manifest, CheckpointError> {
        // The store is read whole, so the deferred update is applied first; a
        // failed load leaves the engine as it was (with that update).
        self.settle_all();
        let manifest = checkpoint::load_into(path, &mut self.store)?;
        if let Some(copies) = &mut self.bf16 {
            copies.mark_all_stale();
        }
        self.updates = manifest.updates;
        Ok(manifest)
    }

    /// Gives up the engine, keeping its store (parameters and optimizer state).
    pub fn into_store(mut self) -> HostStore {
        self.settle_all();
        self.store
    }

    pub fn pager_stats(&self) -> PagerStats {
        self.pager.stats()
    }

    pub fn reset_pager_counters(&mut self) {
        self.pager.reset_counters();
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Number of optimizer updates applied so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// The current value of a parameter (by the id it had in the model given to [`Engine::new`]).
    pub fn param(&mut self, id: &ParamId) -> Option<&[f32]> {
        let (g, k) = *self.slot_of.get(id)?;
        self.settle(g);
        let slot = &self.store.groups[g].slots[k];
        Some(&self.store.groups[g].params.as_slice()[slot.range()])
    }

    /// The accumulated gradient of a parameter (`None` in fused mode).
    pub fn grad(&mut self, id: &ParamId) -> Option<&[f32]> {
        let (g, k) = *self.slot_of.get(id)?;
        self.settle(g);
        let slot = &self.store.groups[g].slots[k];
        Some(&self.store.groups[g].grads.as_ref()?.as_slice()[slot.range()])
    }

    /// Adam moments `(m, v)` of a parameter.
    pub fn moments(&mut self, id: &ParamId) -> Option<(&[f32], &[f32])> {
        let (g, k) = *self.slot_of.get(id)?;
        self.settle(g);
        let (group, slot) = (&self.store.groups[g], &self.store.groups[g].slots[k]);
        let range = slot.range();
        Some((
            &group.adam_m.as_slice()[range.clone()],
            &group.adam_v.as_slice()[range],
        ))
    }

    /// A complete, ordinary module with the store's current values (for
    /// evaluation, sampling or saving).
    pub fn model(&mut self) -> M {
        self.settle_all();
        let mut export = Export {
            store: &self.store,
            slot_of: &self.slot_of,
            device: &self.device,
        };
        self.template.clone().map(&mut export)
    }

    /// One optimizer step over `micro_batches` of `(inputs, targets)`, each
    /// `[batch, seq]`; their gradients are averaged (gradient accumulation).
    pub fn step(
        &mut self,
        micro_batches: &[MicroBatch<B>],
        lr: f64,
    ) -> Result<StepReport, EngineError> {
        check_lr(lr)?;
        self.check_batches(micro_batches)?;
        self.split = StepSplit::default();
        let k = micro_batches.len();
        let tokens = micro_batches
            .iter()
            .map(|(x, _)| x.dims()[0] * x.dims()[1])
            .sum();
        if self.config.fused {
            if k > 1 {
                return Err(EngineError::Config(
                    "fused mode applies each block's update during the backward pass and cannot accumulate \
                     micro-batches; use one micro-batch or disable fused mode"
                        .into(),
                ));
            }
            let (inputs, targets) = &micro_batches[0];
            let weight = token_weight(micro_batches);
            let step = self.updates + 1;
            let single_pass = self.config.grad_clip.is_none() && !self.config.skip_non_finite;
            let (loss, norm, scale) = if single_pass {
                let mut sink = Sink::Update {
                    step,
                    lr,
                    scale: 1.0,
                };
                (
                    self.forward_backward(inputs, targets, &weight, &mut sink)?,
                    f64::NAN,
                    1.0,
                )
            } else {
                let mut norm = Sink::Norm(0.0);
                let loss = self.forward_backward(inputs, targets, &weight, &mut norm)?;
                let Sink::Norm(sum) = norm else {
                    unreachable!("the sink stays a norm sink")
                };
                if !(loss.is_finite() && sum.is_finite()) {
                    return Ok(StepReport::skipped(loss, sum.sqrt(), tokens, self.split));
                }
                let (norm, scale) = match self.config.grad_clip {
                    Some(clip) => clip_scale(sum.sqrt(), clip),
                    None => (sum.sqrt(), 1.0),
                };
                let mut sink = Sink::Update {
                    step,
                    lr,
                    scale: scale as f32,
                };
                self.forward_backward(inputs, targets, &weight, &mut sink)?;
                (loss, norm, scale)
            };
            self.updates = step;
            return Ok(StepReport {
                loss,
                grad_norm: norm,
                clip_scale: scale,
                tokens,
                skipped: false,
                split: self.split,
            });
        }

        let (loss, sum) = self.accumulate(micro_batches)?;
        if self.config.skip_non_finite && !(loss.is_finite() && sum.is_finite()) {
            return Ok(StepReport::skipped(loss, sum.sqrt(), tokens, self.split));
        }
        let (norm, scale) = match self.config.grad_clip {
            Some(clip) => clip_scale(sum.sqrt(), clip),
            None => (sum.sqrt(), 1.0),
        };
        self.updates += 1;
        self.update_all(self.updates, lr, scale as f32);
        self.mark("updates handed out");
        Ok(StepReport {
            loss,
            grad_norm: norm,
            clip_scale: scale,
            tokens,
            skipped: false,
            split: self.split,
        })
    }

    /// Writes the mean gradient of the micro-batches into the gradient buffer
    /// (over its old contents); returns the mean loss. Non-fused mode only.
    pub fn accumulate_gradients(
        &mut self,
        micro_batches: &[MicroBatch<B>],
    ) -> Result<f32, EngineError> {
        if self.config.fused {
            return Err(EngineError::Config(
                "fused mode keeps no gradient buffer".into(),
            ));
        }
        Ok(self.accumulate(micro_batches)?.0)
    }

    /// [`Engine::accumulate_gradients`], also returning the squared norm of
    /// the accumulated gradient: the last micro-batch measures each group as
    /// it lands, while the device computes the next block, rather than in a
    /// pass over the whole buffer after the backward.
    fn accumulate(&mut self, micro_batches: &[MicroBatch<B>]) -> Result<(f32, f64), EngineError> {
        self.check_batches(micro_batches)?;
        let k = micro_batches.len();
        let weight = token_weight(micro_batches);
        let mut loss = 0.0;
        self.group_sum_sq = vec![0.0; self.store.groups.len()];
        for (i, (inputs, targets)) in micro_batches.iter().enumerate() {
            let mut sink = Sink::Accumulate {
                first: i == 0,
                last: i + 1 == k,
            };
            loss += self.forward_backward(inputs, targets, &weight, &mut sink)?;
        }
        self.mark("loss read");
        // The worker's share of the norm comes back with its groups.
        self.settle_all();
        self.mark("gradients settled");
        Ok((loss, self.group_sum_sq.iter().sum()))
    }

    fn check_batches(&self, micro_batches: &[MicroBatch<B>]) -> Result<(), EngineError> {
        if micro_batches.is_empty() {
            return Err(EngineError::Batch("no micro-batches".into()));
        }
        let first = micro_batches[0].0.dims();
        for (i, (x, y)) in micro_batches.iter().enumerate() {
            let (dx, dy) = (x.dims(), y.dims());
            if dx != dy {
                return Err(EngineError::Batch(format!(
                    "micro-batch {i}: inputs {dx:?} and targets {dy:?} differ in shape"
                )));
            }
            if dx != first {
                return Err(EngineError::Batch(format!(
                    "micro-batch {i} has shape {dx:?}, the first has {first:?}"
                )));
            }
            if dx[0] == 0 || dx[1] == 0 {
                return Err(EngineError::Batch(format!(
                    "micro-batch {i} is empty ({dx:?})"
                )));
            }
        }
        Ok(())
    }

    /// Binds block `i` (its weights paged in) for graph-free forward.
    fn bind_block(&mut self, blocks: &[M::Block], i: usize) -> M::Block {
        self.bind_group::<B, _>(blocks[i].clone(), i + 1, false, false)
    }

    /// Binds block `i` under `Autodiff`, its parameters requiring gradients.
    fn bind_block_ad(&mut self, blocks: &[M::Block], i: usize) -> BlockAd<B, M> {
        let template = BlockAd::<B, M>::from_inner(blocks[i].clone());
        self.bind_group::<AD<B>, _>(template, i + 1, true, false)
    }

    /// Binds the stem (embeddings, final norm, head) into the whole template,
    /// in the compute precision or, with `f32`, from the f32 master weights.
    /// The embedding phases bind it in f32: a bf16 embedding gradient would
    /// sum every occurrence of a token in bf16 (autocast keeps embeddings f32
    /// too); its output is cast to the compute precision.
    fn bind_stem<X: Backend, T: Module<X>>(
        &mut self,
        template: T,
        require_grad: bool,
        f32: bool,
    ) -> T
    where
        X::Device: From<B::Device>,
    {
        self.bind_group(template, 0, require_grad, f32)
    }

    /// Binds group `g` into `template` once its deferred update is applied,
    /// from its bf16 copy in bf16 mode unless `f32`.
    fn bind_group<X: Backend, T: Module<X>>(
        &mut self,
        template: T,
        g: usize,
        require_grad: bool,
        f32: bool,
    ) -> T
    where
        X::Device: From<B::Device>,
    {
        self.settle(g);
        if !f32 {
            self.refresh_bf16(g);
        }
        let bf16 = self.bf16.as_ref().filter(|_| !f32).map(|c| c.values(g));
        // The stem is bound into the whole model, whose blocks it skips.
        let no_skip = HashSet::new();
        let skip = if g == 0 { &self.block_ids } else { &no_skip };
        let device = X::Device::from(self.device.clone());
        self.pager.bind(
            template,
            g,
            &self.store.groups[g],
            bf16,
            skip,
            require_grad,
            &device,
        )
    }

    /// Adds the stem's parameter gradients (head or embedding) into `out`.
    fn stem_grads_to_host(
        &mut self,
        stem_ad: &M::TrainModule,
        grads: &<AD<B> as AutodiffBackend>::Gradients,
        out: &mut [f32],
    ) {
        let group = &self.store.groups[0];
        self.pager
            .gradients_to_host::<AD<B>, _>(stem_ad, group, &self.block_ids, grads, out, true);
    }

    /// Hands the head's gradients (the stem's, but for the table at stem slot
    /// `slot`) to the host worker, which writes them into the store's
    /// gradient buffer while the blocks' backward runs: over it for the first
    /// micro-batch (the table's slot zeroed, unless the head also reads it),
    /// added for the others. The last micro-batch measures the squared norm
    /// of every slot but the table's, which phase 4 completes
    /// ([`Engine::add_embedding_grads_in_store`]).
    fn fold_head_grads(&mut self, slot: usize, head_grads: PendingGradients, sink: &Sink) {
        let table = self.store.groups[0].slots[slot].range();
        self.fold_into_store(0, head_grads, sink, table);
    }

    /// Hands group `g`'s gradient copies to the host worker (or runs it
    /// here without one), which writes them into the group's gradient buffer:
    /// over it for the first micro-batch, added for the others. The last
    /// micro-batch measures the squared norm of everything but `unmeasured`
    /// (a range of the group; empty for a whole block).
    fn fold_into_store(
        &mut self,
        g: usize,
        pending: PendingGradients,
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
                let grads = lent
                    .slabs
                    .grads
                    .as_mut()
                    .expect("gradient buffer")
                    .as_mut_slice();
                pending.finish(grads, !first);
                if last {
                    sum_of_squares_outside(grads, unmeasured)
                } else {
                    0.0
                }
            }),
        );
    }

    /// Phase 4 after [`Engine::fold_head_grads`]: adds `dy`'s rows into the
    /// rows of their tokens in the table's slot of the store's gradient
    /// buffer and, for the last micro-batch, the slot's squared norm to the
    /// sink's. No stem-sized copy on the way to the optimizer, only `dy`.
    fn add_embedding_grads_in_store(
        &mut self,
        slot: usize,
        inputs: &Tensor<B, 2, Int>,
        dy: Tensor<B, 3>,
        sink: &mut Sink,
    ) -> Result<(), EngineError> {
        let (tokens, dy) = self.embedding_rows(slot, inputs, dy);
        self.mark("dy read");
        self.settle(0);
        let started = Instant::now();
        let group = &mut self.store.groups[0];
        let table = &group.slots[slot];
        let grads = &mut group
            .grads
            .as_mut()
            .expect("gradient buffer")
            .as_mut_slice()[table.range()];
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
    /// `dy`'s sums per segment of a token's positions (`crate::lookup`);
    /// elsewhere its rows.
    fn embedding_rows(
        &mut self,
        slot: usize,
        inputs: &Tensor<B, 2, Int>,
        dy: Tensor<B, 3>,
    ) -> (Vec<i64>, LookupGrads) {
        let tokens: Vec<i64> = inputs.to_data().iter::<i64>().collect();
        let mut buffer = std::mem::take(&mut self.dy_buffer);
        #[cfg(feature = "cuda")]
        {
            let table_rows = self.store.groups[0].slots[slot].shape[0];
            if check_tokens(&tokens, table_rows).is_ok() {
                let rows = TokenRows::new(&tokens, table_rows);
                if let Some(sums) = crate::lookup_cuda::segment_sums(&dy, &rows) {
                    buffer.resize(sums.shape().num_elements(), 0.0);
                    self.pager.read_into(sums, &mut buffer);
                    return (tokens, LookupGrads::Sums(rows, buffer));
                }
            }
        }
        #[cfg(not(feature = "cuda"))]
        let _ = slot;
        buffer.resize(dy.shape().num_elements(), 0.0);
        self.pager.read_into(dy, &mut buffer);
        (tokens, LookupGrads::Positions(buffer))
    }

    /// Phase 4 where `embed` is a lookup in the table at stem slot `slot`:
    /// `out` gets the head's gradients, every slot written over, and the
    /// table's gradient adds `dy`'s rows into the rows of their tokens, on
    /// the host. The stem is not bound and no table-sized gradient crosses
    /// the bus, only `dy`.
    fn embedding_grads_on_host(
        &mut self,
        slot: usize,
        inputs: &Tensor<B, 2, Int>,
        dy: Tensor<B, 3>,
        head_grads: PendingGradients,
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        let (tokens, dy) = self.embedding_rows(slot, inputs, dy);
        head_grads.finish(out, false);
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

    /// Phase 4 where burn differentiates `embed` (in f32, see `bind_stem`)
    /// with the stem bound on the device: `out` gets the head's gradients,
    /// every slot written over, plus the embedding's.
    fn embedding_grads_on_device(
        &mut self,
        inputs: &Tensor<B, 2, Int>,
        dy: Tensor<B, 3>,
        head_grads: PendingGradients,
        out: &mut [f32],
    ) {
        let stem_ad = self.bind_stem::<AD<B>, _>(
            M::TrainModule::from_inner(self.template.clone()),
            true,
            true,
        );
        self.pager.ready::<B>(&self.device);
        let tokens = Tensor::<AD<B>, 2, Int>::from_inner(inputs.clone());
        let embedded = cast_to(stem_ad.embed(tokens), self.config.compute.dtype());
        let grads = (embedded * Tensor::from_inner(dy)).backward();
        // While the device runs that, the head's gradients (copied long ago)
        // go into the buffer.
        head_grads.finish(out, false);
        self.stem_grads_to_host(&stem_ad, &grads, out);
        drop(stem_ad);
        self.pager.evict(0);
    }

    /// Phases 1–4 for one micro-batch; parameter gradients of `weight ×` the
    /// sum of its tokens' losses go to `sink`. Returns that weighted sum:
    /// with [`token_weight`], the micro-batch's share of the step's mean.
    ///
    /// The next block is always bound before the current one runs (prefetch;
    /// on a GPU its copy overlaps the current block's compute), so at most two
    /// blocks are resident. The stem is resident only while it is used.
    fn forward_backward(
        &mut self,
        inputs: &Tensor<B, 2, Int>,
        targets: &Tensor<B, 2, Int>,
        weight: &Tensor<B, 1>,
        sink: &mut Sink,
    ) -> Result<f32, EngineError> {
        // Placeholder templates: cloning them copies no weights.
        let blocks = self.template.blocks().to_vec();
        let num_blocks = blocks.len();

        // 1. Forward: keep the block inputs, no graph (but the kept blocks').
        let phase = Instant::now();
        let copies = self.pager.stats();
        let (x, state) = self.stream_forward(&blocks, inputs, true)?;
        let ForwardState {
            mut checkpoints,
            mut graphs,
        } = state;
        // The blocks from here on kept their graphs in the forward.
        let first_kept = num_blocks - graphs.len();
        self.split.forward_s += phase.elapsed().as_secs_f64();
        let copies = {
            let now = self.pager.stats();
            self.split.add_copies(&copies, &now, true);
            now
        };
        self.mark("forward done");
        // Every block was bound above, so no update is left but, after a host
        // embedding, the rest of the stem's; the backward writes over the
        // gradients a deferred update reads.
        self.settle_all();

        // 2. Head + loss in chunks of positions, each chunk its own small graph.
        let phase = Instant::now();
        let stem_ad = self.bind_stem::<AD<B>, _>(
            M::TrainModule::from_inner(self.template.clone()),
            true,
            false,
        );
        self.pager.ready::<B>(&self.device);
        // The last recomputed block's weights are copied during the head
        // (kept blocks are still bound from the forward).
        let mut next = (first_kept == num_blocks && num_blocks > 0)
            .then(|| self.bind_block_ad(&blocks, num_blocks - 1));
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
            // (`cross_entropy`).
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
        }
        drop(stem_ad);
        // With the host worker folding them, the head's gradients (the LM
        // head's 262 MB at 0.85B) cross on the download stream: on the
        // compute stream the first block's backward waited for the copy
        // (run26: the device idled 4.8 ms a step).
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
        let mut dy = Tensor::cat(dx_chunks, 1);
        // With the host worker and a lookup embedding, the head's gradients
        // go into the store now, on the worker while the blocks' backward
        // runs; phase 4 then only adds the table's rows. Otherwise phase 4
        // takes them (see `embedding_grads_on_host`).
        let head_grads = match (self.embedding_slot, beside) {
            (Some(slot), true) => {
                self.fold_head_grads(slot, head_grads, sink);
                None
            }
            _ => Some(head_grads),
        };
        self.split.head_s += phase.elapsed().as_secs_f64();
        self.mark("head and loss done");

        let phase = Instant::now();
        // 3. Backward, one block at a time, recomputed from its checkpoint.
        // Block i's gradients are handed on once block i-1's backward is
        // submitted. In overlap mode their copies start at once on a stream
        // beside the compute stream (ordered right behind block i's backward)
        // and the host worker folds them into the buffer. Otherwise the
        // copies are queued right behind block i's backward, block i-1's
        // backward right behind them (no host round trip between), and the
        // host takes them (fused: the optimizer its share) while block i-1
        // computes. One buffer serves the fused sinks, kept across steps.
        let mut block_grads = std::mem::take(&mut self.grad_buffer);
        let mut queued: Option<(usize, PendingGradients)> = None;
        for i in (0..num_blocks).rev() {
            let bind = Instant::now();
            let launch;
            let (block, x_in, y) = if i >= first_kept {
                // The forward kept this block's graph: nothing to recompute.
                let kept = graphs.pop().expect("one graph per kept block");
                if i == first_kept && i > 0 {
                    next = Some(self.bind_block_ad(&blocks, i - 1));
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
                if i > 0 {
                    next = Some(self.bind_block_ad(&blocks, i - 1));
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
        self.split.backward_s += phase.elapsed().as_secs_f64();

        // 4. Embedding backward from dx_0, added to the head's gradients.
        let phase = Instant::now();
        match head_grads {
            // The head's gradients are in the store already.
            None => {
                let slot = self
                    .embedding_slot
                    .expect("folded early only with a lookup");
                self.add_embedding_grads_in_store(slot, inputs, dy, sink)?;
            }
            Some(head_grads) => {
                let mut buffer = std::mem::take(&mut self.grad_buffer);
                let stem_grads = group_prefix(&mut buffer, self.store.groups[0].numel());
                let filled = match self.embedding_slot {
                    Some(slot) => {
                        self.embedding_grads_on_host(slot, inputs, dy, head_grads, stem_grads)
                    }
                    None => {
                        self.embedding_grads_on_device(inputs, dy, head_grads, stem_grads);
                        Ok(())
                    }
                };
                if filled.is_ok() {
                    self.sink_group(0, stem_grads, sink);
                }
                self.grad_buffer = buffer;
                filled?;
            }
        }
        self.split.head_s += phase.elapsed().as_secs_f64();
        self.split.add_copies(&copies, &self.pager.stats(), false);
        self.mark("embedding backward done");

        let loss = loss_sum.map_or(0.0, |sum| {
            (sum * weight.clone()).into_scalar().elem::<f64>()
        });
        Ok(loss as f32)
    }

    /// A trace line (`BURN_OFFLOAD_TRACE=1`), with the device pools' figures.
    fn mark(&self, what: impl std::fmt::Display) {
        if !trace::enabled() {
            return;
        }
        match self.pager.device_memory::<B>(&self.device) {
            Some((used, reserved)) => trace::mark(format_args!(
                "{what} (device pools: {:.2} GiB in use, {:.2} GiB reserved)",
                used as f64 / (1u64 << 30) as f64,
                reserved as f64 / (1u64 << 30) as f64
            )),
            None => trace::mark(what),
        }
    }

    /// The first block whose graph the forward keeps (`num_blocks` when none).
    fn first_kept(&self, num_blocks: usize) -> usize {
        num_blocks - self.config.kept_graphs.min(num_blocks)
    }

    /// Binds block `i` for the forward: under `Autodiff` from `first_kept` on.
    fn bind_forward(
        &mut self,
        blocks: &[M::Block],
        i: usize,
        first_kept: usize,
    ) -> ForwardBlock<M::Block, BlockAd<B, M>> {
        // Trace marks for the first blocks, whose binds follow the step
        // boundary: the wait for the update, then the copies' issue.
        let marked = i < 2 && trace::enabled();
        // The block's own update first: it would wait for the copy's window.
        self.settle(i + 1);
        if marked {
            self.mark(format_args!("block {i} updated"));
        }
        // The copy's window: the host optimizer yields host memory bandwidth
        // to it until it lands (see `copy_window`).
        let copying = (self.worker.is_some() && self.config.hold_updates_for_copies)
            .then(copy_window::copy_started);
        let bound = if i >= first_kept {
            ForwardBlock::Graph(self.bind_block_ad(blocks, i))
        } else {
            ForwardBlock::Plain(self.bind_block(blocks, i))
        };
        if let Some(landed) = copying {
            self.pager.after_uploads::<B>(&self.device, landed);
        }
        if marked {
            self.mark(format_args!("block {i} copies issued"));
        }
        bound
    }

    /// Streams the blocks forward: the stem embeds `inputs`, then each block
    /// runs while the next one's weights are copied. In training (`train`)
    /// every recomputed block's input is stashed for the backward, and the
    /// last [`EngineConfig::kept_graphs`] blocks run under `Autodiff` and keep
    /// their graphs (and weights) until the backward; otherwise no graph.
    fn stream_forward(
        &mut self,
        blocks: &[M::Block],
        inputs: &Tensor<B, 2, Int>,
        train: bool,
    ) -> Result<(Tensor<B, 3>, ForwardState<B, M>), EngineError> {
        let num_blocks = blocks.len();
        let first_kept = if train {
            self.first_kept(num_blocks)
        } else {
            num_blocks
        };
        let embedded = match self.embedding_slot {
            Some(slot) => self.embed_on_host(slot, inputs)?,
            None => {
                let stem = self.bind_stem::<B, M>(self.template.clone(), false, true);
                self.pager.ready::<B>(&self.device);
                let embedded = stem.embed(inputs.clone());
                drop(stem);
                self.pager.evict(0);
                embedded
            }
        };
        let mut x = cast_to(embedded, self.config.compute.dtype());
        self.mark("embedded");
        let mut state = ForwardState {
            checkpoints: Vec::with_capacity(first_kept),
            graphs: Vec::with_capacity(num_blocks - first_kept),
        };
        let mut next = (num_blocks > 0).then(|| self.bind_forward(blocks, 0, first_kept));
        for i in 0..num_blocks {
            let block = next.take().expect("block bound ahead");
            // Block i's weights have landed.
            self.pager.ready::<B>(&self.device);
            if i < 2 {
                self.mark(format_args!("block {i} landed"));
            }
            // Block i+1's copy runs behind block i's compute: bound before
            // block i's kernels are submitted, unless the host worker is still
            // updating it (after the step boundary), where waiting for it
            // would keep block i's kernels from a device with nothing to do.
            let bind_after = i + 1 < num_blocks && self.update_running(i + 2);
            if i + 1 < num_blocks && !bind_after {
                next = Some(self.bind_forward(blocks, i + 1, first_kept));
            }
            let want = x.dims();
            match block {
                ForwardBlock::Plain(block) => {
                    if train {
                        state.checkpoints.push(self.pager.stash(x.clone()));
                    }
                    x = block.forward(x);
                    drop(block);
                    self.pager.evict(i + 1);
                }
                ForwardBlock::Graph(block) => {
                    // Bound until its backward, which reads this graph.
                    let input = Tensor::<AD<B>, 3>::from_inner(x).require_grad();
                    let output = block.forward(input.clone());
                    x = output.clone().inner();
                    state.graphs.push((block, input, output));
                }
            }
            if bind_after {
                self.pager.flush::<B>(&self.device);
                next = Some(self.bind_forward(blocks, i + 1, first_kept));
            }
            if x.dims() != want {
                // Later blocks and the recompute would read a mis-shaped checkpoint.
                drop(next);
                drop(state);
                for g in 1..=num_blocks {
                    self.pager.evict(g);
                }
                return Err(EngineError::Checkpoint {
                    block: i,
                    got: x.dims().to_vec(),
                    want: want.to_vec(),
                });
            }
        }
        Ok((x, state))
    }

    /// The embedding of `inputs` where `embed` is a lookup in the table at
    /// stem slot `slot`: the distinct rows it reads, gathered from the store
    /// on the host and uploaded, then each position's picked on the device
    /// (`crate::lookup`; with a byte tokenizer a few hundred rows, where the
    /// 64k positions' rows were 512 MB to gather and copy at the step
    /// boundary). With the step's update deferred ([`Engine::deferred`]), the
    /// rows read here are updated first, on this thread, then the host
    /// worker gets the blocks' updates and the rest of the stem's, which the
    /// head binds only after the forward.
    fn embed_on_host(
        &mut self,
        slot: usize,
        inputs: &Tensor<B, 2, Int>,
    ) -> Result<Tensor<B, 3>, EngineError> {
        let [batch, seq] = inputs.dims();
        let tokens: Vec<i64> = inputs.to_data().iter::<i64>().collect();
        self.take_back(0);
        let table = &self.store.groups[0].slots[slot];
        let (range, [rows, width]) = (table.range(), [table.shape[0], table.shape[1]]);
        // Before any update: a bad batch leaves the step's update deferred whole.
        check_tokens(&tokens, rows).map_err(|bad| token_error(bad, rows))?;
        let deferred = self.deferred.take().map(|update| {
            let mut picked = vec![false; rows];
            for &t in &tokens {
                picked[t as usize] = true;
            }
            let read = TableRows {
                range: range.clone(),
                width,
                picked,
            };
            let job = self.update_job(0, update, Part::Picked(read.clone()));
            self.run_here(0, true, job);
            (update, read)
        });
        let table = &self.store.groups[0].params.as_slice()[range];
        let lookup = TokenRows::new(&tokens, rows);
        let distinct = lookup.rows.len();
        let picked = self
            .pager
            .upload_filled::<B, _>([1, distinct, width], &self.device, |out| {
                gather_rows(table, width, &lookup.rows, out)
            });
        // The rest of the update is handed out whatever the lookup returned:
        // a partial update must not be left behind.
        if let Some((update, read)) = deferred {
            self.hand_out(update, Part::Rest(read));
        }
        let picked = picked.map_err(|bad| token_error(bad, rows))?;
        // Landed before block 0's weights are copied, which wait for its
        // update: one span of copy time each, no idle gap between them
        // counted as copying.
        self.pager.ready::<B>(&self.device);
        let index = Tensor::<B, 1, Int>::from_data(
            TensorData::new(lookup.index, [batch * seq]),
            &self.device,
        );
        let picked = cast_to(
            picked.reshape([distinct, width]),
            self.config.compute.dtype(),
        );
        Ok(picked.select(0, index).reshape([batch, seq, width]))
    }

    /// Logits at the last position of each sequence, `[batch, vocab]`, with
    /// the blocks streamed as in training's forward (no graph): sampling never
    /// needs the whole model on the device.
    pub fn last_logits(&mut self, inputs: &Tensor<B, 2, Int>) -> Result<Tensor<B, 2>, EngineError> {
        let [batch, seq] = inputs.dims();
        if batch == 0 || seq == 0 {
            return Err(EngineError::Batch(format!(
                "empty input {:?}",
                [batch, seq]
            )));
        }
        let blocks = self.template.blocks().to_vec();
        let (x, _) = self.stream_forward(&blocks, inputs, false)?;
        let stem = self.bind_stem::<B, M>(self.template.clone(), false, false);
        self.pager.ready::<B>(&self.device);
        let logits = stem.head(x.narrow(1, seq - 1, 1));
        drop(stem);
        self.pager.evict(0);
        let vocab = logits.dims()[2];
        Ok(cast_to(logits, DType::F32).reshape([batch, vocab]))
    }

    /// Hands group `g`'s queued gradient copies to the sink. Accumulated
    /// gradients go straight into the group's buffer, on the host worker in
    /// overlap mode (the thread that drives the device does not wait for the
    /// copies); the fused sinks wait here, via `buffer`.
    fn take_block_grads(
        &mut self,
        g: usize,
        pending: PendingGradients,
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

    fn sink_group(&mut self, g: usize, grads: &[f32], sink: &mut Sink) {
        let started = Instant::now();
        self.sink_group_now(g, grads, sink);
        self.split.optimizer_s += started.elapsed().as_secs_f64();
    }

    fn sink_group_now(&mut self, g: usize, grads: &[f32], sink: &mut Sink) {
        let group = &mut self.store.groups[g];
        match sink {
            Sink::Accumulate { first, last } => {
                let buffer = group
                    .grads
                    .as_mut()
                    .expect("gradient buffer")
                    .as_mut_slice();
                match (*last, g, self.embedding_slot) {
                    (false, ..) => crate::pager::write_into(buffer, grads, !*first),
                    // Measured as the early fold does (head, then table), so
                    // both modes agree to the bit.
                    (true, 0, Some(slot)) => {
                        crate::pager::write_into(buffer, grads, !*first);
                        let (table, width) =
                            (group.slots[slot].range(), group.slots[slot].shape[1]);
                        let head = sum_of_squares_outside(buffer, table.clone());
                        let table_sum_sq = self.table_touch.sum_sq(&buffer[table], width);
                        self.add_sum_sq(0, head);
                        self.add_sum_sq(0, table_sum_sq);
                    }
                    (true, ..) => {
                        let sum_sq = crate::pager::write_into_sum_sq(buffer, grads, !*first);
                        self.add_sum_sq(g, sum_sq);
                    }
                }
            }
            Sink::Norm(sum) => *sum += sum_of_squares(grads),
            Sink::Update { step, lr, scale } => {
                let slices = UpdateSlices {
                    params: group.params.as_mut_slice(),
                    m: group.adam_m.as_mut_slice(),
                    v: group.adam_v.as_mut_slice(),
                    grads,
                    bf16: self.bf16.as_mut().map(|c| c.updated(g)),
                };
                self.config.optimizer.update(*step, *lr, *scale, slices);
            }
        }
    }
}

/// The first `numel` values of the gradient buffer, grown (once) if short.
/// Whoever fills them writes every slot, so they are not zeroed per group.
fn group_prefix(buffer: &mut Vec<f32>, numel: usize) -> &mut [f32] {
    if buffer.len() < numel {
        buffer.resize(numel, 0.0);
    }
    &mut buffer[..numel]
}

fn token_error(token: i64, rows: usize) -> EngineError {
    EngineError::Batch(format!(
        "token id {token} is outside the embedding table's {rows} rows"
    ))
}

/// The squared norm of `x` outside `range`, as two sums (before it, then
/// after it: an empty range at 0 gives exactly `sum_of_squares(x)`).
fn sum_of_squares_outside(x: &[f32], range: std::ops::Range<usize>) -> f64 {
    sum_of_squares(&x[..range.start]) + sum_of_squares(&x[range.end..])
}

/// `(norm, scale)`: gradients are multiplied by `clip / norm` when the norm exceeds `clip`.
pub fn clip_scale(norm: f64, clip: f64) -> (f64, f64) {
    let scale = if norm > clip { clip / norm } else { 1.0 };
    (norm, scale)
}

/// Binds every parameter from the store (by id) into a full module.
struct Export<'a, B: Backend> {
    store: &'a HostStore,
    slot_of: &'a HashMap<ParamId, (usize, usize)>,
    device: &'a B::Device,
}

impl<B: Backend> ModuleMapper<B> for Export<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(&(g, k)) = self.slot_of.get(&param.id) else {
            return param;
        };
        let group = &self.store.groups[g];
        let slot = &group.slots[k];
        let values = group.params.as_slice()[slot.range()].to_vec();
        Param::initialized(
            param.id,
            Tensor::from_data(TensorData::new(values, slot.shape.clone()), self.device),
        )
    }
}
