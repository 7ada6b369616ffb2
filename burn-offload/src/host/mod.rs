//! Host-side work with no device code: page-aligned slabs, row math on host
//! slices, the embedding table's lookups, norms, the optimizers, the worker
//! thread that runs them beside the device, the throttle that lets the
//! forward's copies pass first, and phase tracing.

pub mod bf16;
pub mod lookup;
pub mod norm;
pub mod optim;
pub mod rows;
pub mod slab;
pub mod throttle;
pub mod trace;
pub mod worker;
