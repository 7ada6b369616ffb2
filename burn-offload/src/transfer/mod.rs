//! Moving parameter groups, checkpoints and gradients between the host store
//! and the compute device: the [`Pager`] keeps the books and drives a
//! [`Transfer`], the copy machinery of one kind of device.

mod base;
mod grads;
mod pager;
mod processes;

pub use base::{on_device, DeviceMemory, HostTransfer, QueuedRead, Transfer};
#[cfg(feature = "cuda")]
pub use base::{Download, Landed, UploadWait};
pub use grads::{add_to, sum_lanes, DeviceGrads, PendingGradients};
pub use pager::{Pager, PagerStats, Stash};
pub use processes::{all_gather, all_reduce_grads};
