//! What each step reports: its line in the metrics file and on the terminal.

use serde::Serialize;

/// The line of `--metrics` an evaluation writes, after the line of the
/// step it follows.
#[derive(Debug, Clone, Serialize)]
pub struct EvalMetrics {
    /// The step evaluated after (as in its [`StepMetrics`] line).
    pub step: usize,
    /// Mean loss over the held-out windows' trained tokens.
    pub eval_loss: f64,
    /// `exp(eval_loss)`.
    pub eval_perplexity: f64,
    /// Targets the loss is the mean over.
    pub eval_tokens: usize,
    /// Wall time of the evaluation.
    pub eval_s: f64,
    /// Lowest eval loss of the run so far.
    pub best: bool,
}

/// One line of `--metrics` (JSON lines).
#[derive(Debug, Clone, Serialize)]
pub struct StepMetrics {
    pub step: usize,
    /// Mean over the step's trained tokens.
    pub loss: f32,
    /// Targets the step trained on (instruction data trains on the
    /// assistant's tokens only).
    pub trained_tokens: usize,
    pub lr: f64,
    pub tokens_per_s: f64,
    /// Wall time of the step.
    pub step_s: f64,
    /// Parameters of the model.
    pub params: u64,
    /// 6 · parameters · tokens per second of step time, in TFLOPS (the
    /// usual model-FLOPs convention: attention scores are not counted).
    pub model_tflops: f64,
    /// The FLOPs the device ran: the model FLOPs, the recompute of every
    /// block (2 · block parameters · tokens) in each backward pass, and
    /// causal attention's products (nine of `seq² × width` a sequence and
    /// layer with the recompute); fused mode with clipping or the
    /// non-finite guard runs two passes.
    pub hardware_tflops: f64,
    /// Resident set size of the process (host memory), when the OS reports it.
    pub rss_bytes: Option<u64>,
    /// Largest resident set size during the step (Linux: `VmHWM`, reset at
    /// the start of each step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_peak_bytes: Option<u64>,
    /// Engine only: global gradient norm before clipping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    /// Engine only: parameter bytes paged host → device during this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_to_device: Option<u64>,
    /// Engine only: gradient bytes paged device → host during this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_to_host: Option<u64>,
    /// Engine only: peak parameter bytes resident on the device during this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_device_param_bytes: Option<u64>,
    /// GPU only: bytes reserved by the allocator's pools at the end of the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_reserved_bytes: Option<u64>,
    /// Engine only: seconds the step waited for weight uploads to land (GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload_wait_s: Option<f64>,
    /// `--host-params` only: seconds the host optimizer's thread spent
    /// updating during the step (its updates run while the next forward
    /// reads the parameters they are done with).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_update_s: Option<f64>,
    /// `--host-params` only: host bytes paged onto the device during the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paged_in_bytes: Option<u64>,
    /// Engine only: where the step's time went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<burn_offload::StepSplit>,
    /// The step had a non-finite loss or gradient and changed nothing.
    pub skipped: bool,
    /// Steps skipped so far in this run (including before a resume).
    pub skipped_total: usize,
}
