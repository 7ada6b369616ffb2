//! Host-side work with no device code: page-aligned slabs, row math on host
//! slices, the embedding table's lookups, norms, the optimizers, the worker
//! thread that runs them beside the device, the throttle that lets the
//! forward's copies pass first, phase tracing, and the rendezvous of a
//! run's processes.

pub mod bf16;
pub mod lookup;
pub mod norm;
pub mod optim;
pub mod processes;
pub mod rows;
pub mod slab;
pub mod throttle;
pub mod trace;
pub mod worker;
