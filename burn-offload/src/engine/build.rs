//! Building an engine: the model's parameters moved into a host store (or
//! an existing store checked against the model), the template kept, the
//! slabs page-locked, the host worker started.

use std::collections::{HashMap, HashSet};

use burn::module::Module;
use burn::tensor::backend::Backend;

use super::config::ConfigError;
use super::embedding::TableTouch;
use super::StreamedModel;
use super::{DeviceTransfer, Engine, EngineConfig, EngineError, StepSplit};
use crate::host::worker::HostWorker;
use crate::precision::Compute;
use crate::store::{
    param_ids, Bf16Weights, Collect, Frozen, HostStore, HostValues, Member, NoHostValues,
    StoreError, StoreLayout, ToPlaceholders,
};
use crate::transfer::{Pager, Transfer};

use super::lanes::Lane;

/// The engine's one check of its settings, against every device it trains on.
fn check_devices<B: Backend>(
    config: &EngineConfig,
    devices: &[B::Device],
) -> Result<(), EngineError> {
    if devices.is_empty() {
        return Err(ConfigError::NoDevices.into());
    }
    for device in devices {
        config.validate::<B>(device)?;
    }
    if !DeviceTransfer::can_reduce::<B>(devices) {
        return Err(ConfigError::NoCollective {
            devices: devices.len(),
        }
        .into());
    }
    Ok(())
}

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// Moves `model`'s parameters into a new host store; the engine keeps only
    /// a stateless template of the model.
    pub fn new(model: M, config: EngineConfig, device: &B::Device) -> Result<Self, EngineError> {
        Self::on_devices(model, config, std::slice::from_ref(device))
    }

    /// [`Engine::new`] training on several devices, data parallel: each
    /// step's micro-batches run in rounds of one per device (see the module
    /// documentation).
    pub fn on_devices(
        model: M,
        config: EngineConfig,
        devices: &[B::Device],
    ) -> Result<Self, EngineError> {
        Self::with_frozen(model, None, config, devices)
    }

    /// [`Engine::with_frozen`] taking the parameters `values` holds from it
    /// on the host (a checkpoint's tensors), never drawn on a device.
    pub fn with_host_values(
        model: M,
        values: &dyn HostValues,
        frozen: Option<&Frozen>,
        config: EngineConfig,
        devices: &[B::Device],
    ) -> Result<Self, EngineError> {
        check_devices::<B>(&config, devices)?;
        let layout = StoreLayout {
            gradient_buffer: !config.fused,
            bf16_block_gradients: config.compute_precision_gradients,
            eight_bit_moments: config.eight_bit_moments,
        };
        let block_ids = param_ids(model.blocks());
        // Lazily initialised weights are drawn one tensor at a time, straight
        // into the host store.
        let (template, store) = HostStore::take_from::<B, M, DeviceTransfer>(
            model, &block_ids, layout, frozen, values,
        )?;
        Self::with_store_on(template, store, config, devices)
    }

    /// [`Engine::on_devices`] with the parameters `frozen` names held
    /// frozen in its format: bound without gradients, never updated, and
    /// with no gradient buffer or optimizer state (a LoRA fine-tune's base).
    pub fn with_frozen(
        model: M,
        frozen: Option<&Frozen>,
        config: EngineConfig,
        devices: &[B::Device],
    ) -> Result<Self, EngineError> {
        Self::with_host_values(model, &NoHostValues, frozen, config, devices)
    }

    /// Pairs a model (its values are ignored) with an existing store, checking
    /// that every group has the shapes the model expects.
    pub fn with_store(
        model: M,
        store: HostStore,
        config: EngineConfig,
        device: &B::Device,
    ) -> Result<Self, EngineError> {
        Self::with_store_on(model, store, config, std::slice::from_ref(device))
    }

    /// [`Engine::with_store`] training on several devices, as
    /// [`Engine::on_devices`] does.
    pub fn with_store_on(
        model: M,
        store: HostStore,
        config: EngineConfig,
        devices: &[B::Device],
    ) -> Result<Self, EngineError> {
        check_devices::<B>(&config, devices)?;
        if store.layout.gradient_buffer == config.fused {
            return Err(ConfigError::StoreLayout {
                store_has_buffer: store.layout.gradient_buffer,
                fused: config.fused,
            }
            .into());
        }
        if store.layout.gradient_buffer
            && store.layout.bf16_block_gradients != config.compute_precision_gradients
        {
            return Err(ConfigError::GradientPrecision {
                store_bf16: store.layout.bf16_block_gradients,
            }
            .into());
        }
        if store.layout.eight_bit_moments != config.eight_bit_moments {
            return Err(ConfigError::MomentKind {
                store_eight_bit: store.layout.eight_bit_moments,
            }
            .into());
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
            let mut collect = Collect::default();
            block.visit(&mut collect);
            store.check_group(i + 1, collect.out.iter().map(|p| p.shape.clone()).collect())?;
            for (p, member) in collect.out.into_iter().zip(&store.groups[i + 1].members) {
                block_ids.insert(p.id);
                slot_of.insert(p.id, (i + 1, *member));
            }
        }
        let mut collect = Collect::default();
        model.visit(&mut collect);
        collect.out.retain(|p| !block_ids.contains(&p.id));
        store.check_group(0, collect.out.iter().map(|p| p.shape.clone()).collect())?;
        for (p, member) in collect.out.into_iter().zip(&store.groups[0].members) {
            slot_of.insert(p.id, (0, *member));
        }
        // Only a trained, 2-D stem slot can take the host's scatter-add (a
        // frozen table is bound on the device and gets no gradient).
        let embedding_slot = model
            .embedding_table()
            .and_then(|table| slot_of.get(&table.id))
            .and_then(|&(g, member)| match member {
                Member::Trained(k) if g == 0 && store.groups[0].slots[k].shape.len() == 2 => {
                    Some(k)
                }
                _ => None,
            });
        let template = model.map(&mut ToPlaceholders);
        let mut lanes: Vec<Lane<B>> = devices
            .iter()
            .map(|device| Lane {
                device: device.clone(),
                pager: Pager::new(!config.overlap),
            })
            .collect();
        // Host work runs on every core beside the device: waiting threads
        // must not spin (they kept the GPU busy only three quarters of a step).
        if config.blocking_sync {
            for lane in &lanes {
                lane.pager.blocking_sync::<B>(&lane.device);
            }
        }
        // Uploads read the parameter slabs; page-locked, they run at DMA
        // speed. Locked once, for every device (lane 0's pager keeps them).
        let Lane { device, pager } = &mut lanes[0];
        let bf16 = (config.compute == Compute::Bf16 && !config.cast_on_device)
            .then(|| Bf16Weights::new(&store));
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
        for group in &store.groups {
            for bytes in group.frozen.slab_bytes() {
                pager.pin::<B>(bytes, device);
            }
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
            lanes,
            store,
            bf16,
            config,
            updates: 0,
            split: StepSplit::default(),
            grad_buffer: Vec::new(),
            dy_buffer: Vec::new(),
            num_params,
            deferred: None,
            table_touch: TableTouch::default(),
            group_sum_sq: Vec::new(),
            processes: None,
            worker,
        })
    }
}
