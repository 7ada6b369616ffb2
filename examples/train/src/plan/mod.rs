//! The memory planner: the host and device bytes a training job will need,
//! predicted from the model config and batch shape before anything is
//! allocated, checked against what the machine has.
//!
//! Host figures are exact for the store (fp32 weights, Adam m and v, and the
//! gradient buffer unless fused) and close for the engine's own buffers.
//! Device figures are estimates: one Llama/GPT-2 block's activations under
//! autodiff are counted tensor by tensor (docs/ARCHITECTURE.md §6) with a margin for the
//! backward's temporaries, plus a fixed allowance for the CUDA context and
//! the allocator's pools. The block backward and the LM head are phases that
//! never hold memory at the same time: the larger of the two counts. On a GPU
//! cubecl reserves whole pages, one of each size class once any is used, so
//! the peak is never below that floor (measured on the H100: 6.6 GiB of pool
//! for a 7.6 GiB process; bench/results/cuda-bench).
//!
//! `job` says what is trained and `knobs` the settings the plan may decide;
//! `estimate` predicts the bytes; `placement` decides the knobs left to the
//! plan for a machine; `check` says whether a job fits, and what would.

mod check;
mod estimate;
mod job;
mod knobs;
mod placement;

pub use check::{DoesNotFit, Shortfall};
pub(crate) use estimate::shape;
pub use estimate::{kept_attention_bytes, kept_graph_bytes, Item, Plan};
pub use job::{Job, Machine};
pub use knobs::{
    BlockInputs, HostLayout, KeptGraphs, OptimState, ParamCache, Recompute,
    GRADIENT_BLOCKS_IN_FLIGHT,
};
