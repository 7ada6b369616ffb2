//! The devices an engine trains on: one *lane* each, which binds blocks from
//! the one host store, runs the phases on its own micro-batch, and keeps its
//! own copy books. Gradients meet across lanes before they leave the devices.

use burn::tensor::backend::Backend;

use super::DeviceTransfer;
use crate::transfer::Pager;

/// One device of the engine and its copy books.
pub(super) struct Lane<B: Backend> {
    pub device: B::Device,
    pub pager: Pager<DeviceTransfer>,
}
