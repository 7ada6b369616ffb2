//! What the engine shows of its state: the store (every deferred update
//! applied first), single parameters and their gradients and moments, the
//! whole model, checkpoints, and trace marks.

use std::borrow::Cow;
use std::collections::HashMap;

use burn::module::{ModuleMapper, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::StreamedModel;
use super::{Engine, EngineConfig};
use crate::host::trace;
use crate::store::checkpoint::{self, CheckpointError};
use crate::store::{Bf16Weights, HostStore, Member, MomentValues};
use crate::transfer::PagerStats;

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
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

    /// Restores the parameters alone from a checkpoint (its optimizer state
    /// is not read, the update count not changed): a model to generate with.
    /// On any error the engine is left as it was.
    pub fn load_weights(
        &mut self,
        path: &std::path::Path,
    ) -> Result<checkpoint::Manifest, CheckpointError> {
        self.settle_all();
        let manifest = checkpoint::load_params_into(path, &mut self.store)?;
        if let Some(copies) = &mut self.bf16 {
            copies.mark_all_stale();
        }
        Ok(manifest)
    }

    /// Gives up the engine, keeping its store (parameters and optimizer state).
    pub fn into_store(mut self) -> HostStore {
        self.settle_all();
        self.store
    }

    /// The traffic and residency counters, summed over the devices.
    pub fn pager_stats(&self) -> PagerStats {
        let mut stats = PagerStats::default();
        for lane in &self.lanes {
            stats.add(&lane.pager.stats());
        }
        stats
    }

    /// Forgets the traffic counters and peaks.
    pub fn reset_pager_counters(&mut self) {
        for lane in &mut self.lanes {
            lane.pager.reset_counters();
        }
    }

    /// The devices the engine trains on (one lane each).
    pub fn devices(&self) -> Vec<B::Device> {
        self.lanes.iter().map(|lane| lane.device.clone()).collect()
    }

    /// How the engine trains.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Number of optimizer updates applied so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// The group and slot of a trained parameter.
    fn trained_slot(&self, id: &ParamId) -> Option<(usize, usize)> {
        match *self.slot_of.get(id)? {
            (g, Member::Trained(k)) => Some((g, k)),
            (_, Member::Frozen(_)) => None,
        }
    }

    /// The current value of a parameter (by the id it had in the model given to [`Engine::new`]).
    pub fn param(&mut self, id: &ParamId) -> Option<&[f32]> {
        let (g, k) = self.trained_slot(id)?;
        self.settle(g);
        let slot = &self.store.groups[g].slots[k];
        Some(&self.store.groups[g].params.as_slice()[slot.range()])
    }

    /// The accumulated gradient of a parameter (`None` in fused mode), as
    /// f32 (widened where the buffer holds bf16).
    pub fn grad(&mut self, id: &ParamId) -> Option<Cow<'_, [f32]>> {
        let (g, k) = self.trained_slot(id)?;
        self.settle(g);
        let slot = &self.store.groups[g].slots[k];
        let grads = self.store.groups[g].grads.as_ref()?.values();
        Some(grads.f32_range(slot.range()))
    }

    /// Adam moments `(m, v)` of a parameter, as f32 (dequantised when 8-bit).
    pub fn moments(&mut self, id: &ParamId) -> Option<MomentValues<'_>> {
        let (g, k) = self.trained_slot(id)?;
        self.settle(g);
        let group = &self.store.groups[g];
        Some(group.moments.values(group.slots[k].range()))
    }

    /// A complete, ordinary module with the store's current values (for
    /// evaluation, sampling or saving), on the first device.
    pub fn model(&mut self) -> M {
        self.export(true)
    }

    /// [`Engine::model`] with only the trained parameters (a LoRA run's
    /// adapters) given their values; the frozen ones stay zero-cost
    /// placeholders, so nothing base-sized is built (what writing the
    /// adapters alone needs).
    pub fn trained_model(&mut self) -> M {
        self.export(false)
    }

    fn export(&mut self, frozen: bool) -> M {
        self.settle_all();
        let mut export = Export {
            store: &self.store,
            slot_of: &self.slot_of,
            frozen,
            device: &self.lanes[0].device,
        };
        self.template.clone().map(&mut export)
    }

    /// A trace line (`BURN_OFFLOAD_TRACE=1`), with the first device's pool figures.
    pub(super) fn mark(&self, what: impl std::fmt::Display) {
        if !trace::enabled() {
            return;
        }
        let lane = &self.lanes[0];
        match lane.pager.device_memory::<B>(&lane.device) {
            Some(memory) => trace::mark(format_args!(
                "{what} (device pools: {:.2} GiB in use, {:.2} GiB reserved, {} pages past the budget; \
                 device: {:.2} GiB used)",
                memory.in_use as f64 / (1u64 << 30) as f64,
                memory.reserved as f64 / (1u64 << 30) as f64,
                memory.pages_past_budget,
                memory.device_used as f64 / (1u64 << 30) as f64,
            )),
            None => trace::mark(what),
        }
    }
}

/// Binds every parameter from the store (by id) into a full module (the
/// frozen ones only with `frozen`).
struct Export<'a, B: Backend> {
    store: &'a HostStore,
    slot_of: &'a HashMap<ParamId, (usize, Member)>,
    frozen: bool,
    device: &'a B::Device,
}

impl<B: Backend> ModuleMapper<B> for Export<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(&(g, member)) = self.slot_of.get(&param.id) else {
            return param;
        };
        let group = &self.store.groups[g];
        let (values, shape) = match member {
            Member::Trained(k) => {
                let slot = &group.slots[k];
                let values = group.params.as_slice()[slot.range()].to_vec();
                (values, slot.shape.clone())
            }
            // Widened to f32 (dequantised where held quantised).
            Member::Frozen(k) if self.frozen => {
                (group.frozen.to_f32(k), group.frozen.slots[k].shape.clone())
            }
            Member::Frozen(_) => return param,
        };
        Param::initialized(
            param.id,
            Tensor::from_data(TensorData::new(values, shape), self.device),
        )
    }
}
