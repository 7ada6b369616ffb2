//! A training run: set up from its options (`setup`: checks, model, data,
//! resume; `data`: what it trains and evaluates on), on a machine whose memory the plan fits (`machine`), stepped by
//! the engine's loop or the resident one (`job`), with what it carries
//! between steps and reports at the end (`state`, `resume`).

mod data;
mod evaluate;
mod job;
mod lora;
mod machine;
mod resume;
mod setup;
mod state;

pub use data::DataReadError;
pub use job::JobError;
pub use machine::{
    big_models_table, largest_lora_bases, largest_presets, longest_sequence, machine, plan,
    LargestPreset, MachineError, StoreMode, STORE_MODES,
};
pub use resume::{ResumeError, RunShape};
pub use setup::{plan_table, preflight, run, Checked, SetupError, TrainError};
pub use state::{BestEval, Evaluation, TrainReport, TrainerState};
