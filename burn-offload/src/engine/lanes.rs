//! The devices an engine trains on: one *lane* each, which binds blocks from
//! the one host store, runs the phases on its own micro-batch, and keeps its
//! own copy books. Gradients meet across lanes before they leave the devices.
//!
//! An engine may also be one process of several ([`Engine::join_processes`]),
//! each with one device and its own host store: the run's lanes are then
//! numbered across the processes (process `r`'s is lane `r`), a step's
//! micro-batches are the same on every process and each runs its lane's
//! share, and every sum that meets across lanes also meets across processes,
//! so each store gets the same update.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;

use super::config::ConfigError;
use super::{DeviceTransfer, Engine, EngineError, StreamedModel};
use crate::host::processes::ProcessGroup;
use crate::transfer::{all_gather, all_reduce_grads, DeviceGrads, Pager, Transfer};

/// One device of the engine and its copy books.
pub(super) struct Lane<B: Backend> {
    pub device: B::Device,
    pub pager: Pager<DeviceTransfer>,
}

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// Makes this engine rank `group.rank()`'s lane of a run of
    /// `group.world()` processes. Every process must have built its engine
    /// the same way (one device each) and hold the same parameters, which is
    /// checked here; join after loading a checkpoint. From then on every
    /// step takes the whole run's micro-batches, the same on every process,
    /// and trains on its lane's share of them.
    pub fn join_processes(&mut self, group: Arc<ProcessGroup>) -> Result<(), EngineError> {
        if self.lanes.len() > 1 {
            return Err(ConfigError::ProcessesWithLanes {
                lanes: self.lanes.len(),
            }
            .into());
        }
        if !DeviceTransfer::can_join::<B>(&self.lanes[0].device) {
            return Err(ConfigError::NoCollective {
                devices: group.world(),
            }
            .into());
        }
        self.settle_all();
        let mut fingerprint = self.updates.to_le_bytes().to_vec();
        for sum in self.parameter_checksums() {
            fingerprint.extend_from_slice(&sum.to_le_bytes());
        }
        group.check_agree("parameters (checksums of its host store)", &fingerprint)?;
        self.processes = Some(group);
        Ok(())
    }

    /// One CRC32 of each group's parameters, as stored.
    fn parameter_checksums(&self) -> Vec<u32> {
        self.store
            .groups
            .par_iter()
            .map(|group| crc32fast::hash(bytemuck::cast_slice(group.params.as_slice())))
            .collect()
    }

    /// The run's lanes: this engine's devices, times its processes.
    pub(super) fn run_lanes(&self) -> usize {
        self.lanes.len() * self.processes.as_ref().map_or(1, |g| g.world())
    }

    /// The run's number of this engine's first lane.
    pub(super) fn first_lane(&self) -> usize {
        self.lanes.len() * self.processes.as_ref().map_or(0, |g| g.rank())
    }

    /// The device (lane of this engine) that takes the run's lane `k`'s
    /// share of the embedding's backward: its own where it is this engine's,
    /// else this engine's one device (each process adds every lane's rows to
    /// its own store).
    pub(super) fn lane_of(&self, k: usize) -> usize {
        if self.processes.is_some() {
            0
        } else {
            k
        }
    }

    /// `grads` (summed over this engine's lanes) summed over the run's
    /// processes too.
    pub(super) fn across_processes(
        &self,
        grads: DeviceGrads<B>,
    ) -> Result<DeviceGrads<B>, EngineError> {
        match &self.processes {
            Some(group) => Ok(all_reduce_grads::<DeviceTransfer, B>(grads, group)?),
            None => Ok(grads),
        }
    }

    /// Every lane's `dy` of the run, in lane order: this engine's, or with
    /// processes, every process's (one lane each) gathered onto its device.
    pub(super) fn gather_lanes<const D: usize>(
        &self,
        dy: Vec<Tensor<B, D>>,
    ) -> Result<Vec<Tensor<B, D>>, EngineError> {
        match &self.processes {
            Some(group) => {
                let [dy] = <[_; 1]>::try_from(dy).expect("one lane per process");
                Ok(all_gather::<DeviceTransfer, B, D>(dy, group)?)
            }
            None => Ok(dy),
        }
    }

    /// The step's loss from each of this engine's lanes' share (`weighted`,
    /// one value each on its device), summed in f64 over the run's lanes in
    /// lane order.
    pub(super) fn run_loss(&self, weighted: Vec<Tensor<B, 1>>) -> Result<f64, EngineError> {
        let all = match &self.processes {
            Some(group) => {
                let [mine] = <[_; 1]>::try_from(weighted).expect("one lane per process");
                all_gather::<DeviceTransfer, B, 1>(mine, group)?
            }
            None => weighted,
        };
        Ok(all
            .into_iter()
            .map(|value| {
                let data: TensorData = value.into_data().convert::<f64>();
                data.as_slice::<f64>().expect("f64")[0]
            })
            .sum())
    }
}
