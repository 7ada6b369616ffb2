//! The devices an engine trains on: one *lane* each, which binds blocks from
//! the one host store, runs the phases on its own micro-batch, and keeps its
//! own copy books. Gradients meet across lanes before they leave the devices.

use burn::tensor::backend::Backend;

use super::StreamedModel;
use super::{DeviceTransfer, Engine};
use crate::transfer::{sum_lanes, DeviceGrads, Pager};

/// One device of the engine and its copy books.
pub(super) struct Lane<B: Backend> {
    pub device: B::Device,
    pub pager: Pager<DeviceTransfer>,
}

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// One group's gradients from each lane, summed onto lane `root`'s
    /// device (a lone lane's as they are).
    pub(super) fn sum_lanes(&self, mut lanes: Vec<DeviceGrads<B>>, root: usize) -> DeviceGrads<B> {
        if lanes.len() == 1 {
            return lanes.pop().expect("one lane");
        }
        sum_lanes::<DeviceTransfer, B>(lanes, root)
    }
}
