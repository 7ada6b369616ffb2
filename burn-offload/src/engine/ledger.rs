//! The ledger of parameter groups: which are lent to the host worker (and
//! for which job), which updates are deferred, and how each comes back.
//!
//! A group is *lent* when its slabs are out with the worker; *settled* when
//! it is back with every update the step owes it applied. Binding a group,
//! reading or writing the store, and checkpoints settle first.

use std::time::Instant;

use burn::tensor::backend::Backend;

use super::Engine;
use super::StreamedModel;
use crate::host::optim::{Rows, UpdateSlices};
use crate::host::slab::Bf16Slab;
use crate::host::worker::{HostWorker, Job};
use crate::store::GroupSlabs;

/// A group's slabs as lent to the host worker: its f32 state and, in bf16
/// mode, its bf16 copy.
pub(super) struct Lent {
    pub slabs: GroupSlabs,
    pub bf16: Option<Bf16Slab>,
}

/// One optimizer update of a group, as `OptimizerConfig::update` takes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Update {
    pub step: u64,
    pub lr: f64,
    pub scale: f32,
}

/// Which of a group's elements an update job covers: all of them, or, for
/// the stem, the rows of its embedding table that a forward reads (`Picked`),
/// then everything else (`Rest`).
pub(super) enum Part {
    Whole,
    Picked(TableRows),
    Rest(TableRows),
}

/// Rows of the embedding table inside the stem's slabs.
#[derive(Clone)]
pub(super) struct TableRows {
    /// The table's elements in the stem group.
    pub range: std::ops::Range<usize>,
    pub width: usize,
    /// Per table row: whether it is one of the rows.
    pub picked: Vec<bool>,
}

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
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
    pub(super) fn settle(&mut self, g: usize) {
        if let Some(update) = self.deferred.take() {
            self.hand_out(update, Part::Whole);
        }
        self.take_back(g);
    }

    /// Lends every group to the worker for `update`: the blocks in the order
    /// the forward binds them, then `stem` of the stem, which the forward
    /// reads last (the head).
    pub(super) fn hand_out(&mut self, update: Update, stem: Part) {
        for g in 1..self.store.groups.len() {
            self.take_back(g);
            self.run_update(g, update, Part::Whole);
        }
        self.take_back(0);
        self.run_update(0, update, stem);
    }

    /// Whether the host worker is still running a job on group `g`.
    pub(super) fn update_running(&mut self, g: usize) -> bool {
        self.worker.as_mut().is_some_and(|w| w.is_running(g))
    }

    /// Takes group `g` back from the host worker once its job is done (a no-op
    /// when it is not lent); an update not handed out stays deferred.
    pub(super) fn take_back(&mut self, g: usize) {
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
    pub(super) fn lend_group(&mut self, g: usize, bf16: bool) -> Lent {
        Lent {
            slabs: self.store.groups[g].lend(),
            bf16: self.bf16.as_mut().filter(|_| bf16).map(|c| c.take(g)),
        }
    }

    /// Puts group `g`'s lent slabs (and bf16 copy) back in place.
    pub(super) fn restore_group(&mut self, g: usize, lent: Lent) {
        self.store.groups[g].restore(lent.slabs);
        if let Some(slab) = lent.bf16 {
            self.bf16.as_mut().expect("bf16 copies").put(g, slab);
        }
    }

    /// Runs `job` on group `g`'s slabs (and, with `bf16`, its bf16 copy): on
    /// the host worker in overlap mode, else here and now.
    pub(super) fn run_on_group(&mut self, g: usize, bf16: bool, job: Job<Lent>) {
        self.settle(g);
        self.run_on_settled(g, bf16, job);
    }

    /// [`Engine::run_on_group`] on a group that is not lent, leaving an
    /// update not handed out yet deferred.
    pub(super) fn run_on_settled(&mut self, g: usize, bf16: bool, job: Job<Lent>) {
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
    pub(super) fn run_here(&mut self, g: usize, bf16: bool, job: Job<Lent>) {
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
    pub(super) fn update_all(&mut self, step: u64, lr: f64, scale: f32) {
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
    pub(super) fn run_update(&mut self, g: usize, update: Update, part: Part) {
        let job = self.update_job(update, part);
        self.run_on_settled(g, true, job);
    }

    /// The job that applies `update` to `part` of the group it is run on
    /// (its bf16 copy too).
    pub(super) fn update_job(&self, update: Update, part: Part) -> Job<Lent> {
        let optimizer = self.config.optimizer;
        Box::new(move |lent| {
            let slabs = &mut lent.slabs;
            let slices = UpdateSlices {
                params: slabs.params.as_mut_slice(),
                moments: slabs.moments.slices(),
                grads: slabs
                    .grads
                    .as_ref()
                    .expect("gradient buffer in non-fused mode")
                    .values(),
                bf16: lent.bf16.as_mut().map(Bf16Slab::as_mut_slice),
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
    pub(super) fn add_sum_sq(&mut self, g: usize, sum_sq: f64) {
        if let Some(sum) = self.group_sum_sq.get_mut(g) {
            *sum += sum_sq;
        }
    }

    /// Brings group `g`'s bf16 weights up to date (bf16 mode) before a bind.
    pub(super) fn refresh_bf16(&mut self, g: usize) {
        if let Some(copies) = self.bf16.as_mut().filter(|c| c.is_stale(g)) {
            copies.refresh(g, self.store.groups[g].params.as_slice());
        }
    }
}
