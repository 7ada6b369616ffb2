//! What a run carries between steps and what it reports at its end.

use std::path::PathBuf;

use models::ModelConfig;
use serde::{Deserialize, Serialize};

/// What a checkpoint records for the trainer to continue exactly where it stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub model: ModelConfig,
    pub tokenizer: String,
    pub batch: usize,
    pub seq_len: usize,
    pub accum: usize,
    /// Devices the run trained on (checkpoints before `--gpus` had one).
    #[serde(default = "one")]
    pub gpus: usize,
    /// Processes the run trained in (`--world-size`; checkpoints before it
    /// had one).
    #[serde(default = "one")]
    pub processes: usize,
    /// Training steps completed (skipped ones included).
    pub steps_done: usize,
    pub skipped_total: usize,
    /// State of the batch sampler's generator: the data position.
    pub batcher_rng: u64,
    /// Identity of the token stream, so a resume on other data is refused.
    pub corpus_tokens: usize,
    pub corpus_crc32: u32,
    /// The lowest eval loss so far, for `--keep-best` to keep through a
    /// resume (checkpoints before evaluation have none).
    #[serde(default)]
    pub best_eval: Option<BestEval>,
    /// A LoRA run's adapters and the frozen base they train on: the
    /// checkpoint holds only the adapters' state, so a resume must find the
    /// same base (checkpoints of full training have none).
    #[serde(default)]
    pub adapters: Option<AdapterRun>,
}

/// What a LoRA run's checkpoint needs from the run that resumes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterRun {
    pub lora: models::LoraConfig,
    /// How the base was held: `resident`, or the engine's `--base-dtype`.
    pub base_dtype: String,
    /// `--init-from`, as given then (informative: a moved folder resumes).
    pub base: Option<PathBuf>,
    /// CRC32 of the base's weight files' names, sizes and safetensors
    /// headers (every tensor's name, dtype, shape and place), or of the
    /// seed its random weights were drawn from.
    pub base_crc32: u32,
}

impl AdapterRun {
    /// Whether a run with `other` continues this one's adapters.
    pub fn continues(&self, other: &AdapterRun) -> bool {
        (&self.lora, &self.base_dtype, self.base_crc32)
            == (&other.lora, &other.base_dtype, other.base_crc32)
    }
}

/// The run's lowest eval loss and when it was measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BestEval {
    /// Steps done when it was measured.
    pub steps_done: usize,
    pub loss: f64,
}

pub(crate) fn one() -> usize {
    1
}

/// What a finished run returns.
#[derive(Debug, Clone)]
pub struct TrainReport {
    pub config: ModelConfig,
    /// Losses of the steps run by this call (after the resume point).
    pub losses: Vec<f32>,
    pub sample: String,
    /// Step this call started from (non-zero after `--resume`).
    pub start_step: usize,
    /// The checkpoint the run continued from.
    pub resumed_from: Option<PathBuf>,
    /// Stopped by this signal (SIGINT, SIGTERM) after saving what it could;
    /// nothing was exported or sampled.
    pub interrupted: Option<i32>,
    /// The last checkpoint written, if any.
    pub checkpoint: Option<PathBuf>,
    /// The Hugging Face folder written, if any.
    pub exported: Option<PathBuf>,
    /// The PEFT adapter folder written (`--export-peft`), if any.
    pub adapters: Option<PathBuf>,
    pub skipped_total: usize,
    /// This call's evaluations, by steps done.
    pub evaluations: Vec<(usize, Evaluation)>,
    /// The run's lowest eval loss (before a resume too).
    pub best_eval: Option<BestEval>,
}

/// What one evaluation measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean loss over the held-out trained tokens.
    pub loss: f64,
    /// Targets the mean is over.
    pub tokens: usize,
    /// Wall time.
    pub seconds: f64,
}

/// How a training loop ended.
#[derive(Default)]
pub(crate) struct Outcome {
    pub(crate) losses: Vec<f32>,
    pub(crate) sample: String,
    pub(crate) start_step: usize,
    pub(crate) interrupted: Option<i32>,
    pub(crate) checkpoint: Option<PathBuf>,
    pub(crate) exported: Option<PathBuf>,
    pub(crate) adapters: Option<PathBuf>,
    pub(crate) skipped_total: usize,
    pub(crate) evaluations: Vec<(usize, Evaluation)>,
    pub(crate) best_eval: Option<BestEval>,
}
