//! The host store: every parameter and its optimizer state in page-aligned
//! host slabs, one group per block plus the stem; the bf16 copies the device
//! reads in bf16 mode; checkpoints of it all.

mod bf16;
pub mod checkpoint;
mod frozen;
mod group;
mod host_store;
mod moments;
mod template;

pub use bf16::Bf16Weights;
pub use frozen::{Frozen, FrozenAt, FrozenDtype, FrozenParams, FrozenSlot, FrozenValues};
pub use group::{GradBuffer, GroupSlabs, Member, ParamGroup, ParamSlot};
pub use host_store::{HostStore, StoreError, StoreLayout};
pub use moments::{MomentValues, Moments, Q8Slab};
pub(crate) use template::{param_ids, Collect, ToPlaceholders};
pub use template::{HostValues, NoHostValues, ReadBack};
