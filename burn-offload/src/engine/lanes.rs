//! The devices an engine trains on: one *lane* each, which binds blocks from
//! the one host store, runs the phases on its own micro-batch, and keeps its
//! own copy books. Gradients meet across lanes before they leave the devices.

use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Tensor, TensorKind};

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

/// `tensor` on `device`: as it is when it is there already, else through
/// host memory. burn's `to_device` between two CUDA devices goes through
/// cubecl's own NCCL communicators, which one thread cannot set up for two
/// devices; only small tensors (token ids, a weight) cross this way.
pub(super) fn on_device<B: Backend, const D: usize, K>(
    tensor: Tensor<B, D, K>,
    device: &B::Device,
) -> Tensor<B, D, K>
where
    K: TensorKind<B> + BasicOps<B>,
{
    if tensor.device() == *device {
        return tensor;
    }
    Tensor::from_data(tensor.into_data(), device)
}
