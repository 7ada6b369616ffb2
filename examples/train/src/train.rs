//! The `train` program: options, validation, and the training loop.
//!
//! Phases of a step: draw a batch → forward → loss → backward → clip + AdamW
//! update at the scheduled learning rate → log. Every user error (bad preset,
//! unreadable corpus, impossible shapes) is reported before any model is built.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use anyhow::{bail, Result};
use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::module::HasAutodiffModule;
use burn::module::{ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, TensorData};
use burn_offload::checkpoint::{CheckpointDir, CheckpointError};
use burn_offload::{
    BlockModel, Compute, DecoderBlock, Documents, Engine, EngineConfig, HostOptimizerConfig,
    OptimizerConfig,
};
use models::{cross_entropy, ModelConfig};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::data::token_cache;
use crate::data::{default_corpus, trained_targets, Batcher};
use crate::export;
use crate::instruct::{self, DataFormat};
use crate::outputs::{MetricsFile, ResumeMarker};
use crate::plan::{
    BlockInputs, HostLayout, Job as PlanJob, KeptGraphs, Machine, OptimState, ParamCache, Plan,
    GRADIENT_BLOCKS_IN_FLIGHT,
};
use crate::processes::{agree_on_signal, RankOptions};
use crate::progress::{human_count, Progress, StepLine};
use crate::schedule::WarmupCosine;
use crate::signals;
use crate::tokenizer::Tokenizer;
use crate::{peak_rss_bytes, process_rss_bytes, DefaultBackend};
use burn_offload::trace;
use burn_offload::ProcessGroup;

/// Which implementation runs attention on CUDA in bf16 and f16 (`--attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AttentionKernels {
    /// cuDNN's fused attention where libcudnn 9 is found at run time (and
    /// takes the shape), else the crate's CubeCL kernels.
    Auto,
    /// The crate's CubeCL kernels (and query blocks and key tiles).
    Cubecl,
}

/// Everything the `train` command line can set.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub model: String,
    pub steps: usize,
    pub batch: usize,
    pub seq_len: usize,
    pub lr: f64,
    pub warmup: usize,
    pub min_lr_ratio: f64,
    pub weight_decay: f64,
    pub grad_clip: f64,
    pub seed: u64,
    pub data: Option<PathBuf>,
    /// `byte`, `gpt2` or a `tokenizer.json` (file or folder); `None`: the
    /// `--init-from` checkpoint's tokenizer.json when it has one, else byte.
    pub tokenizer: Option<String>,
    pub metrics: Option<PathBuf>,
    pub sample_tokens: usize,
    pub temperature: f64,
    pub progress: bool,
    /// Plain burn (`Autodiff` on the whole model + burn-optim AdamW) instead of the offload engine.
    pub resident: bool,
    /// With `resident`: the model on `Offload<B>` (parameters in host memory,
    /// paged in as operations read them) with the host AdamW (its state in
    /// host memory too): the type parameter's path.
    pub host_params: bool,
    /// With `host_params`: bytes (GiB) of device copies of the parameters the
    /// cache keeps; `None`: decided by the memory plan.
    pub param_cache_gib: Option<f64>,
    /// Engine: update each block as its gradient arrives (no gradient buffer).
    pub fused: bool,
    /// Engine: no overlap (the bench's serialised baseline): every weight copy
    /// starts once the device is idle and lands before compute goes on, and
    /// the CPU handles a block's gradients only once the device is idle.
    pub serial_copies: bool,
    /// Engine on CUDA: let threads that wait for the device spin (the
    /// driver's default) instead of sleeping; a benchmark baseline.
    pub spin_waits: bool,
    /// Engine: let the host optimizer run while the forward's weight copies
    /// are in flight (sharing host memory bandwidth with them) instead of
    /// waiting for each to land; a benchmark baseline.
    pub updates_during_copies: bool,
    /// Engine: update without first checking the gradients for non-finite
    /// values (fused mode then runs the backward once instead of twice).
    pub no_guard: bool,
    /// Micro-batches of `batch` sequences accumulated per optimizer step (on
    /// each device).
    pub accum: usize,
    /// Engine: devices trained on, data parallel (each its own micro-batches
    /// of `batch` sequences, `accum` of them per step): GPUs 0..n on CUDA, n
    /// logical devices elsewhere.
    pub gpus: usize,
    /// Engine: this process's place in a run of several processes, one GPU
    /// each (`--rank`/`--world-size`); `None`: a run of one process.
    pub processes: Option<RankOptions>,
    /// Precision of the device's compute (host state stays f32).
    pub compute: Compute,
    /// The matmul kernel of the CUDA backend: `auto` (burn's) or one of
    /// [`burn_offload::matmul_names`].
    pub matmul: String,
    /// Attention's implementation on CUDA (bf16 and f16).
    pub attention: AttentionKernels,
    /// Engine: tokens per chunk of the LM head and loss.
    pub loss_chunk_tokens: usize,
    /// Engine on a GPU: where the block inputs it recomputes from are kept.
    pub block_inputs: BlockInputs,
    /// Engine below fp32 compute: how the host holds gradients and the
    /// weights for upload (`auto`: compact when the full layout does not fit).
    pub host_layout: HostLayout,
    /// Engine: the optimizer's moments in fp32 or 8-bit.
    pub optim_state: OptimState,
    /// Engine: how many of the last blocks keep their forward graph on the
    /// device instead of being recomputed (`auto`: as many as fit a GPU).
    pub kept_graphs: KeptGraphs,
    /// Write checkpoints into this folder (every `checkpoint_every` steps, at
    /// the end, and on Ctrl-C).
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end and on Ctrl-C).
    pub checkpoint_every: usize,
    /// Checkpoints to keep.
    pub keep: usize,
    /// Continue from a checkpoint (its folder, or a folder of checkpoints: the newest).
    pub resume: Option<PathBuf>,
    /// Stop after this many consecutive steps with a non-finite loss or gradient.
    pub max_skips: usize,
    /// Host memory the run may use, in GiB (default: what the OS reports available).
    pub host_mem_gib: Option<f64>,
    /// GPU memory the run may use, in GiB (default: free memory on the GPU).
    pub gpu_mem_gib: Option<f64>,
    /// Start from a Hugging Face checkpoint folder (config.json + safetensors);
    /// its config replaces `model`.
    pub init_from: Option<PathBuf>,
    /// After training, write the model as a Hugging Face checkpoint here.
    pub export_hf: Option<PathBuf>,
    /// Let `export_hf` replace a folder that holds files or that the run
    /// starts from.
    pub overwrite: bool,
    /// Stop (with a checkpoint, if a folder is set) once this many steps are
    /// done, keeping `--steps` as the schedule's length (time-sliced jobs).
    pub stop_after: Option<usize>,
    /// What `--data` holds (`Auto`: decided from the files).
    pub data_format: DataFormat,
    /// Where tokenized text corpora are cached (default:
    /// [`token_cache::default_root`]).
    pub data_cache: Option<PathBuf>,
    /// Instruction data: train on the prompt's tokens too, not only the
    /// assistant's.
    pub train_on_prompt: bool,
    /// Instruction data: pack several examples into a window (else one each,
    /// padded).
    pub packing: bool,
    /// Fault injection for tests: make the stem parameters NaN before this step.
    #[doc(hidden)]
    pub poison_at_step: Option<usize>,
}

/// Optimizer steps of a run that names none: the built-in demo's (about a
/// minute on two cores, after which its sample reads as text).
pub const DEFAULT_STEPS: usize = 600;
/// Peak learning rate of a run from scratch that names none: the built-in
/// tiny model's.
pub const DEFAULT_LR: f64 = 1e-2;
/// Peak learning rate of a fine-tune (`--init-from`) that names none: the
/// usual full fine-tuning rate of pretrained models.
pub const DEFAULT_FINETUNE_LR: f64 = 2e-5;
/// Temperature of the sample after training.
pub const DEFAULT_TEMPERATURE: f64 = 0.7;

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            model: "tiny".into(),
            steps: DEFAULT_STEPS,
            batch: 16,
            seq_len: 64,
            lr: DEFAULT_LR,
            warmup: 20,
            min_lr_ratio: 0.1,
            weight_decay: 0.01,
            grad_clip: 1.0,
            seed: 42,
            data: None,
            tokenizer: None,
            metrics: None,
            sample_tokens: 200,
            temperature: DEFAULT_TEMPERATURE,
            progress: false,
            resident: false,
            host_params: false,
            param_cache_gib: None,
            fused: false,
            serial_copies: false,
            spin_waits: false,
            updates_during_copies: false,
            no_guard: false,
            accum: 1,
            gpus: 1,
            processes: None,
            compute: Compute::Fp32,
            matmul: burn_offload::DEFAULT_MATMUL.into(),
            attention: AttentionKernels::Auto,
            loss_chunk_tokens: 4096,
            block_inputs: BlockInputs::Auto,
            host_layout: HostLayout::Auto,
            optim_state: OptimState::Fp32,
            kept_graphs: KeptGraphs::Auto,
            checkpoint_dir: None,
            checkpoint_every: 0,
            keep: 3,
            resume: None,
            max_skips: 5,
            host_mem_gib: None,
            gpu_mem_gib: None,
            init_from: None,
            export_hf: None,
            overwrite: false,
            stop_after: None,
            data_format: DataFormat::Auto,
            data_cache: None,
            train_on_prompt: false,
            packing: true,
            poison_at_step: None,
        }
    }
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
}

fn one() -> usize {
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
    pub skipped_total: usize,
}

/// Model config after applying the tokenizer: presets take the tokenizer's
/// vocabulary; a JSON config must already be large enough for it.
fn resolve_config(opts: &TrainOptions, tokenizer: &Tokenizer) -> Result<ModelConfig> {
    let from_hf = opts.init_from.is_some();
    let mut config = match &opts.init_from {
        Some(dir) => models::hf::load_config(dir)?,
        None if Path::new(&opts.model).is_dir() => bail!(
            "--model `{}` is a folder; --model takes a preset name or a config .json file \
             (a Hugging Face checkpoint folder goes to --init-from)",
            opts.model
        ),
        None => ModelConfig::from_arg(&opts.model)?,
    };
    let vocab = tokenizer.vocab_size();
    if !from_hf && models::PRESETS.contains(&opts.model.as_str()) {
        config.set_vocab_size(vocab);
    } else if config.vocab_size() < vocab {
        bail!(
            "model vocab_size {} is smaller than the {} tokenizer's vocabulary ({vocab})",
            config.vocab_size(),
            tokenizer.name()
        );
    }
    if opts.seq_len > config.max_seq_len() {
        bail!(
            "--seq-len {} exceeds the model's context length {}",
            opts.seq_len,
            config.max_seq_len()
        );
    }
    Ok(config)
}

fn validate(opts: &TrainOptions) -> Result<()> {
    let positive = [
        ("--accum", opts.accum),
        ("--gpus", opts.gpus),
        ("--loss-chunk-tokens", opts.loss_chunk_tokens),
        ("--steps", opts.steps),
        ("--batch", opts.batch),
        ("--seq-len", opts.seq_len),
    ];
    for (flag, value) in positive {
        if value == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    if !cfg!(feature = "cuda") && opts.attention != AttentionKernels::Auto {
        bail!("--attention chooses CUDA's attention kernels, and this build runs on the CPU");
    }
    if !(opts.lr.is_finite() && opts.lr > 0.0) {
        bail!("--lr must be a positive number, got {}", opts.lr);
    }
    if !(opts.temperature.is_finite() && opts.temperature >= 0.0) {
        bail!("--temperature must be >= 0, got {}", opts.temperature);
    }
    if !(opts.grad_clip.is_finite() && opts.grad_clip >= 0.0) {
        bail!(
            "--grad-clip must be a number >= 0 (0 switches clipping off), got {}",
            opts.grad_clip
        );
    }
    if !(opts.weight_decay.is_finite() && opts.weight_decay >= 0.0) {
        bail!(
            "--weight-decay must be a number >= 0, got {}",
            opts.weight_decay
        );
    }
    for (flag, gib) in [
        ("--host-mem-gib", opts.host_mem_gib),
        ("--gpu-mem-gib", opts.gpu_mem_gib),
    ] {
        if let Some(gib) = gib.filter(|g| !(g.is_finite() && *g > 0.0)) {
            bail!("{flag} must be a positive number of GiB, got {gib}");
        }
    }
    let engine_only = [
        ("--fused", opts.fused),
        ("--serial-copies", opts.serial_copies),
        ("--spin-waits", opts.spin_waits),
        ("--updates-during-copies", opts.updates_during_copies),
        ("--no-guard", opts.no_guard),
        ("--stop-after", opts.stop_after.is_some()),
        ("--gpus", opts.gpus > 1),
        ("--world-size", opts.processes.is_some()),
    ];
    if let Some(place) = &opts.processes {
        place.validate()?;
        if opts.gpus > 1 {
            bail!(
                "--gpus {} with --world-size: a run of several processes trains on one GPU each; \
                 start one process per GPU",
                opts.gpus
            );
        }
    }
    if let Some((flag, _)) = engine_only.iter().find(|(_, set)| opts.resident && *set) {
        bail!("{flag} is an option of the offload engine; drop it or --resident");
    }
    if opts.optim_state == OptimState::EightBit && opts.resident {
        bail!("--optim-state 8bit is an option of the offload engine; drop it or --resident");
    }
    if opts.host_layout == HostLayout::Compact {
        if opts.resident {
            bail!(
                "--host-layout compact is an option of the offload engine; drop it or --resident"
            );
        }
        if opts.compute == Compute::Fp32 {
            bail!(
                "--host-layout compact applies to a compute precision below fp32 (--compute bf16)"
            );
        }
    }
    if opts.host_params && !opts.resident {
        bail!("--host-params is an option of plain burn training; add --resident");
    }
    if let Some(gib) = opts.param_cache_gib {
        if !opts.host_params {
            bail!("--param-cache-gib sizes the cache of --host-params (the type parameter's path); add --resident --host-params");
        }
        if !(gib > 0.0 && gib.is_finite()) {
            bail!("--param-cache-gib must be a positive number of GiB, not {gib}");
        }
    }
    if opts.resident && (opts.checkpoint_dir.is_some() || opts.resume.is_some()) {
        bail!("checkpoints are written from the offload engine's host store; drop --resident");
    }
    if opts.fused && opts.accum > 1 {
        bail!(
            "--fused cannot accumulate --accum {} micro-batches: it applies each block's update \
             as the backward reaches it; drop --fused or --accum",
            opts.accum
        );
    }
    if opts.overwrite && opts.export_hf.is_none() {
        bail!("--overwrite lets --export-hf replace a folder; add --export-hf or drop it");
    }
    if opts.checkpoint_every > 0 && opts.checkpoint_dir.is_none() {
        bail!("--checkpoint-every needs --checkpoint-dir (the folder to write them into)");
    }
    if opts.keep == 0 {
        bail!("--keep must be at least 1 (the newest checkpoint is always kept)");
    }
    match opts.stop_after {
        Some(0) => bail!("--stop-after must be at least 1"),
        Some(n) if n > opts.steps => {
            bail!("--stop-after {n} is beyond --steps {}", opts.steps)
        }
        _ => {}
    }
    if opts.max_skips == 0 {
        bail!("--max-skips must be at least 1");
    }
    if !(0.0..=1.0).contains(&opts.min_lr_ratio) {
        bail!(
            "--min-lr-ratio must be in [0, 1], got {}",
            opts.min_lr_ratio
        );
    }
    Ok(())
}

/// What a run reads, each part checked against the others; nothing is
/// allocated or written to find it out.
pub struct Checked {
    pub tokenizer: Tokenizer,
    pub config: ModelConfig,
    /// What `--data` holds.
    pub format: DataFormat,
}

/// The options, the tokenizer and the model config, checked.
fn checked_model(opts: &TrainOptions) -> Result<(Tokenizer, ModelConfig)> {
    validate(opts)?;
    let tokenizer = Tokenizer::for_run(opts.tokenizer.as_deref(), opts.init_from.as_deref())?;
    let config = resolve_config(opts, &tokenizer)?;
    Ok((tokenizer, config))
}

/// Everything about a run that can be checked before anything is built:
/// the options, the tokenizer, the model config, what `--data` holds and
/// where the export goes. The launcher of several processes runs it before
/// starting any, and every run before its memory plan.
pub fn preflight(opts: &TrainOptions) -> Result<Checked> {
    let (tokenizer, config) = checked_model(opts)?;
    let format = match (&opts.data, opts.data_format) {
        (Some(path), DataFormat::Auto) => instruct::detect(path).map_err(flagged("--data"))?,
        (None, DataFormat::Auto) => DataFormat::Text,
        (_, format) => format,
    };
    if format == DataFormat::Text && (opts.train_on_prompt || !opts.packing) {
        bail!("--train-on-prompt and --no-packing apply to instruction data, and --data is text");
    }
    if opts.data_cache.is_some() && (format != DataFormat::Text || opts.data.is_none()) {
        bail!("--data-cache holds tokenized text corpora; --data is not a text corpus");
    }
    if let Some(dir) = opts.export_hf.as_ref().filter(|_| writes_outputs(opts)) {
        let sources: Vec<export::Source<'_>> = [
            ("--init-from", &opts.init_from),
            ("--resume", &opts.resume),
            ("--checkpoint-dir", &opts.checkpoint_dir),
        ]
        .into_iter()
        .filter_map(|(flag, path)| path.as_deref().map(|path| export::Source { flag, path }))
        .collect();
        export::check(dir, opts.overwrite, &sources)?;
    }
    Ok(Checked {
        tokenizer,
        config,
        format,
    })
}

/// An error about the file a flag names, said as `--flag `path` …` when the
/// message starts with the path (others name their subject themselves).
pub fn flagged<E: std::fmt::Display>(flag: &'static str) -> impl Fn(E) -> anyhow::Error {
    move |err| {
        let text = err.to_string();
        if text.starts_with('`') {
            anyhow::anyhow!("{flag} {text}")
        } else {
            anyhow::anyhow!(text)
        }
    }
}

/// Runs a training job on the default backend.
pub fn run(opts: &TrainOptions) -> Result<TrainReport> {
    let Checked {
        tokenizer,
        config,
        format,
    } = preflight(opts)?;
    // Before the first CUDA tensor: pages of the pools sized to the budget.
    #[cfg(feature = "cuda")]
    if let Some(gib) = opts.gpu_mem_gib {
        burn_offload::cuda_backend::limit_memory_pages((gib * GIB) as u64);
    }
    if opts.progress {
        if let (None, Some(dir), Tokenizer::Byte) = (&opts.tokenizer, &opts.init_from, &tokenizer) {
            eprintln!(
                "warning: --init-from `{}` has no tokenizer.json: tokenizing as bytes (256 ids); \
                 give --tokenizer the model's tokenizer.json",
                dir.display()
            );
        }
    }
    let placed = check_memory(opts, &config)?;
    if opts.progress && !opts.resident {
        let mlp = match placed.mlp_tile {
            Some(tile) => format!("; MLP over tiles of {tile} tokens"),
            None => String::new(),
        };
        eprintln!("memory plan: {}{mlp}", placed.store_mode());
    }
    if opts.host_params {
        let bytes = placed.param_cache.bytes();
        burn_offload::residency::set_param_cache_bytes(bytes);
        if opts.progress {
            eprintln!(
                "parameter cache: {:.2} GiB of device copies",
                bytes as f64 / GIB
            );
        }
    }
    let (batcher, corpus) = match (&opts.data, format) {
        (Some(path), DataFormat::Alpaca | DataFormat::Sharegpt | DataFormat::Chat) => {
            let shaping = instruct::Shaping {
                format,
                seq_len: opts.seq_len,
                train_on_prompt: opts.train_on_prompt,
                packing: opts.packing,
            };
            let prepared =
                instruct::prepare(path, shaping, &tokenizer).map_err(flagged("--data"))?;
            prepared.check_trains()?;
            if opts.progress {
                eprintln!(
                    "{} data: {} examples, {} tokens ({:.0} tok/s tokenized), {} truncated to \
                     --seq-len, {} windows{}, {} targets trained on",
                    prepared.format,
                    prepared.examples,
                    prepared.tokens,
                    prepared.tokens_per_s,
                    prepared.truncated,
                    prepared.windows.count(),
                    if opts.packing {
                        " (packed, each example attending only to itself)"
                    } else {
                        ""
                    },
                    prepared.trained,
                );
                if prepared.emptied > 0 {
                    eprintln!(
                        "warning: --seq-len {} leaves no token to train on in {} of the {} \
                         examples (the longest, {}, has {} tokens); {} windows without a trained \
                         token dropped",
                        opts.seq_len,
                        prepared.emptied,
                        prepared.examples,
                        prepared.longest.1,
                        prepared.longest.0,
                        prepared.dropped_windows
                    );
                }
            }
            let windows = prepared.windows;
            // The inputs, then the targets (ignored ones as their u32 bits).
            let identity = windows
                .inputs
                .iter()
                .copied()
                .chain(windows.targets.iter().map(|&t| t as u32));
            let corpus = (windows.inputs.len(), corpus_crc32(identity));
            (Batcher::windows(windows, opts.seed)?, corpus)
        }
        (Some(path), _) => {
            let root = opts
                .data_cache
                .clone()
                .unwrap_or_else(token_cache::default_root);
            let tokenized =
                token_cache::tokenize(path, &tokenizer, &root).map_err(flagged("--data"))?;
            if opts.progress {
                let how = match tokenized.tokens_per_s {
                    Some(rate) => format!("tokenized at {rate:.0} tok/s into"),
                    None => "read from".to_string(),
                };
                let forced = match tokenized.forced_cuts {
                    0 => String::new(),
                    n => format!(
                        " ({n} pieces cut inside a run of 1 MiB without a space or line break)"
                    ),
                };
                eprintln!(
                    "corpus: {} tokens, {how} `{}`{forced}",
                    tokenized.tokens.len(),
                    tokenized.folder.display()
                );
            }
            let corpus = (tokenized.tokens.len(), tokenized.crc32);
            (
                Batcher::mapped(tokenized.tokens, opts.seq_len, opts.seed)
                    .map_err(flagged("--data"))?,
                corpus,
            )
        }
        (None, _) => {
            let tokens = tokenizer.encode(&default_corpus());
            let corpus = (tokens.len(), corpus_crc32(tokens.iter().copied()));
            (Batcher::new(tokens, opts.seq_len, opts.seed)?, corpus)
        }
    };
    let resume = match &opts.resume {
        Some(path) => Some(Resume::read(path, opts, &config, &tokenizer, corpus)?),
        None => None,
    };

    type B = DefaultBackend;
    type AB = Autodiff<DefaultBackend>;
    burn_offload::set_matmul(&opts.matmul).map_err(|why| anyhow::anyhow!("--matmul: {why}"))?;
    #[cfg(feature = "cuda")]
    burn_offload::ops::attention::set_cudnn_attention(opts.attention == AttentionKernels::Auto);
    // The engine's devices (`--gpus`, or this rank's GPU), checked before
    // the model is built; the model is drawn on the first.
    let devices = lane_devices(opts)?;
    let device = devices.first().cloned().expect("one device at least");
    opts.compute
        .check::<B>(&device)
        .map_err(|why| anyhow::anyhow!("--compute {}: {why}", opts.compute))?;
    if let Some(dir) = &opts.init_from {
        // Every tensor present with its shape, before anything is written
        // (the weights are read when the model is built).
        match &config {
            ModelConfig::Llama(c) => {
                models::hf::check_weights(&c.init::<B>(&device), &config, dir)?
            }
            ModelConfig::Gpt2(c) => models::hf::check_weights(&c.init::<B>(&device), &config, dir)?,
        }
    }
    if let Some(resume) = resume
        .as_ref()
        .filter(|r| r.state.steps_done == opts.steps && opts.export_hf.is_none())
    {
        // Nothing to train, export or sample: the run is complete.
        return Ok(TrainReport {
            config,
            losses: Vec::new(),
            sample: String::new(),
            start_step: resume.state.steps_done,
            resumed_from: Some(resume.path.clone()),
            interrupted: None,
            checkpoint: None,
            exported: None,
            skipped_total: resume.state.skipped_total,
        });
    }

    // Every output is checked (the export folder in `preflight`, the
    // checkpoint folder locked here) before the model is built: a bad path
    // costs no training. Of several processes, rank 0 writes them.
    let outputs = writes_outputs(opts);
    let run_id = match &resume {
        Some(resume) => resume.run.clone(),
        None => format!("{:016x}", rand::random::<u64>()),
    };
    let checkpoints = match opts.checkpoint_dir.as_ref().filter(|_| outputs) {
        Some(dir) => Some(crate::outputs::checkpoint_dir(dir, &run_id, opts.keep)?),
        None => None,
    };
    let metrics = match opts.metrics.as_ref().filter(|_| outputs) {
        Some(path) => Some(MetricsFile::open(path, resume.is_some())?),
        None => None,
    };
    // The other ranks, met once each has checked its own inputs.
    let group = match &opts.processes {
        Some(place) => Some(place.join()?),
        None => None,
    };
    signals::update(|progress| {
        *progress = signals::Progress {
            steps_done: resume.as_ref().map_or(0, |r| r.state.steps_done),
            saved: resume
                .as_ref()
                .map(|r| (r.path.clone(), r.state.steps_done)),
            checkpointing: checkpoints.is_some(),
        }
    });

    let resumed_from = resume.as_ref().map(|r| r.path.clone());
    let job = Job {
        opts,
        tokenizer: &tokenizer,
        batcher,
        metrics,
        checkpoints,
        resume,
        config: config.clone(),
        corpus,
        block_inputs: placed.block_inputs,
        kept_graphs: placed.kept_graphs.count(),
        kept_attention: placed.kept_attention,
        gradient_blocks_in_flight: placed.gradient_blocks_in_flight,
        cast_on_device: placed.compact(),
        compute_precision_gradients: placed.compact_gradients(),
        building: Instant::now(),
        group,
    };
    // `--host-params`: the same loop over `Offload<B>` with the host AdamW.
    type HostAb = Autodiff<burn_offload::Offload<DefaultBackend>>;
    let clipping = (opts.grad_clip > 0.0).then_some(
        burn::grad_clipping::GradientClippingConfig::Norm(opts.grad_clip as f32),
    );
    let burn_adamw = AdamWConfig::new()
        .with_weight_decay(opts.weight_decay as f32)
        .with_grad_clipping(clipping.clone());
    let host_adamw = HostOptimizerConfig::adamw(burn_offload::AdamWConfig {
        weight_decay: opts.weight_decay as f32,
        ..Default::default()
    })
    .with_grad_clipping(clipping);
    let outcome = match (&config, opts.resident, opts.host_params) {
        (ModelConfig::Gpt2(c), true, false) => job.train_resident::<AB, _, _>(
            initial(opts, &config, &device, true, || c.init::<AB>(&device))?.0,
            burn_adamw.init(),
            &device,
        )?,
        (ModelConfig::Llama(c), true, false) => job.train_resident::<AB, _, _>(
            initial(opts, &config, &device, true, || c.init::<AB>(&device))?.0,
            burn_adamw.init(),
            &device,
        )?,
        (ModelConfig::Gpt2(c), true, true) => job.train_resident::<HostAb, _, _>(
            initial(opts, &config, &device, true, || c.init::<HostAb>(&device))?.0,
            host_adamw.init(),
            &device,
        )?,
        (ModelConfig::Llama(c), true, true) => job.train_resident::<HostAb, _, _>(
            initial(opts, &config, &device, true, || c.init::<HostAb>(&device))?.0,
            host_adamw.init(),
            &device,
        )?,
        (ModelConfig::Gpt2(c), false, _) => job.train_engine::<B, _>(
            initial(opts, &config, &device, false, || c.init::<B>(&device))?,
            &devices,
        )?,
        (ModelConfig::Llama(c), false, _) => job.train_engine::<B, _>(
            initial(opts, &config, &device, false, || c.init::<B>(&device))
                .map(|(model, rng)| (model.with_mlp_tiles(placed.mlp_tile), rng))?,
            &devices,
        )?,
    };
    if opts.progress && opts.host_params {
        let (paged, prefetch, updates) = (
            burn_offload::residency::stats(),
            burn_offload::prefetch::stats(),
            burn_offload::host_update_stats(),
        );
        let steps = prefetch.steps.max(1) as f64;
        eprintln!(
            "offload: {:.2} GB paged in ({:.2} GB cache peak of {:.2}); prefetch: {} copies ({:.2} GB), \
             trace followed by {} of {} steps; host updates {:.3} s a step, {:.3} s waiting for gradients",
            paged.bytes_to_device as f64 / 1e9,
            paged.peak_resident_bytes as f64 / 1e9,
            paged.budget_bytes as f64 / 1e9,
            prefetch.copies,
            prefetch.bytes as f64 / 1e9,
            prefetch.replayed,
            prefetch.steps,
            updates.updating.as_secs_f64() / steps,
            updates.waiting.as_secs_f64() / steps,
        );
    }
    #[cfg(feature = "cuda")]
    if opts.progress && opts.matmul != "auto" {
        // How much of the work the chosen kernel took, and what it left to
        // burn's matmul: a kernel that declines the common cases buys nothing.
        let stats = burn_offload::cuda_backend::matmul_stats();
        eprintln!(
            "matmul {}: ran {} matmuls ({:.2} s in its calls), left {} to burn's matmul",
            opts.matmul, stats.launched, stats.call_s, stats.fell_back
        );
        for case in &stats.declined {
            eprintln!("  declined: {case}");
        }
    }
    Ok(TrainReport {
        config,
        losses: outcome.losses,
        sample: outcome.sample,
        start_step: outcome.start_step,
        resumed_from,
        interrupted: outcome.interrupted,
        checkpoint: outcome.checkpoint,
        exported: outcome.exported,
        skipped_total: outcome.skipped_total,
    })
}

/// burn's CPU backends draw random tensors from one process-wide RNG, and a
/// module's parameters are drawn lazily, on first use. Seeding and drawing
/// every initial weight happen under this lock, so two jobs in one process
/// (the test suite, a sweep) cannot interleave their draws: a run's weights
/// depend on its seed alone.
static WEIGHT_RNG: Mutex<()> = Mutex::new(());

/// The starting model: drawn from `--seed`, or with `--init-from`'s weights
/// (burn's lazy parameters are replaced before any random init runs).
///
/// With `draw`, every weight is drawn here. Without, the weights stay lazy
/// and the caller draws them while it holds the returned lock: the engine
/// draws one tensor at a time straight into its host store, so a model larger
/// than the device never exists on it whole.
fn initial<X: Backend, M: burn::module::Module<X>>(
    opts: &TrainOptions,
    config: &ModelConfig,
    device: &X::Device,
    draw: bool,
    init: impl FnOnce() -> M,
) -> Result<(M, MutexGuard<'static, ()>)> {
    let rng = WEIGHT_RNG.lock().unwrap_or_else(PoisonError::into_inner);
    X::seed(device, opts.seed);
    let model = init();
    let model = match &opts.init_from {
        Some(dir) => models::hf::load_weights(model, config, dir)?,
        None => model,
    };
    if draw {
        model.visit(&mut DrawWeights);
    }
    Ok((model, rng))
}

/// Forces every lazily initialised parameter to be drawn now.
struct DrawWeights;

impl<X: Backend> ModuleVisitor<X> for DrawWeights {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<X, D>>) {
        let _ = param.val();
    }
}

/// How a training loop ended.
#[derive(Default)]
struct Outcome {
    losses: Vec<f32>,
    sample: String,
    start_step: usize,
    interrupted: Option<i32>,
    checkpoint: Option<PathBuf>,
    exported: Option<PathBuf>,
    skipped_total: usize,
}

/// The checkpoint a run continues from, read and checked before the model
/// is built.
struct Resume {
    path: PathBuf,
    /// The run that wrote it: this run continues it, in the same folder.
    run: String,
    state: TrainerState,
}

impl Resume {
    /// Reads `--resume`'s checkpoint (the newest written, for a folder of
    /// them) and checks that it continues this very run.
    fn read(
        path: &Path,
        opts: &TrainOptions,
        config: &ModelConfig,
        tokenizer: &Tokenizer,
        corpus: (usize, u32),
    ) -> Result<Self> {
        let path = burn_offload::checkpoint::resolve(path)?;
        let manifest = burn_offload::checkpoint::read_manifest(&path)?;
        let state: TrainerState = serde_json::from_value(manifest.trainer).map_err(|why| {
            anyhow::anyhow!(
                "checkpoint `{}` has no readable trainer state: {why}",
                path.display()
            )
        })?;
        let here = path.display();
        let name = |c: &ModelConfig| serde_json::to_string(c).unwrap_or_default();
        if state.model != *config {
            bail!(
                "checkpoint `{here}` is for model {}, but --model gives {}",
                name(&state.model),
                name(config)
            );
        }
        if state.tokenizer != tokenizer.name() {
            bail!(
                "checkpoint `{here}` was trained with tokenizer `{}`, not `{}`",
                state.tokenizer,
                tokenizer.name()
            );
        }
        if (state.corpus_tokens, state.corpus_crc32) != corpus {
            bail!("checkpoint `{here}` was trained on other data ({} tokens); resume with the same --data and --tokenizer", state.corpus_tokens);
        }
        let shape = |s: &TrainerState| (s.batch, s.seq_len, s.accum, s.gpus, s.processes);
        let ours = (
            opts.batch,
            opts.seq_len,
            opts.accum,
            opts.gpus,
            world_size(opts),
        );
        if shape(&state) != ours {
            bail!(
                "checkpoint `{here}` used --batch/--seq-len/--accum/--gpus/--world-size {:?}, not {ours:?}",
                shape(&state)
            );
        }
        if state.steps_done > opts.steps {
            bail!(
                "checkpoint `{here}` is at step {}, beyond --steps {}",
                state.steps_done,
                opts.steps
            );
        }
        if let Some(stop) = opts.stop_after.filter(|&stop| stop <= state.steps_done) {
            bail!(
                "--stop-after {stop} is not beyond checkpoint `{here}`, which is at step {}",
                state.steps_done
            );
        }
        Ok(Self {
            path,
            run: manifest.run,
            state,
        })
    }
}

/// CRC32 of token ids as little-endian u32, the corpus identity checkpoints keep.
fn corpus_crc32(tokens: impl IntoIterator<Item = u32>) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h.finalize()
}

const GIB: f64 = (1u64 << 30) as f64;

/// Host memory the OS reports available (`MemAvailable`), in bytes.
fn available_host_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The machine the job runs on: host memory from `--host-mem-gib` or
/// MemAvailable (the GPU hosts grow RAM on demand, hence the flag), device
/// memory from `--gpu-mem-gib` or the CUDA driver.
pub fn machine(opts: &TrainOptions) -> Result<Machine> {
    let (mut host_bytes, mut host_source) = match opts.host_mem_gib {
        Some(gib) => ((gib * GIB) as u64, "--host-mem-gib".to_string()),
        None => match available_host_bytes() {
            Some(bytes) => (bytes, "MemAvailable".to_string()),
            None => (u64::MAX, "unknown: not checked".to_string()),
        },
    };
    // The processes on a host each keep a store of their own in its memory.
    if let Some(place) = opts.processes.as_ref().filter(|p| p.local_world_size > 1) {
        if opts.host_mem_gib.is_none() && host_bytes != u64::MAX {
            host_bytes /= place.local_world_size as u64;
            host_source = format!(
                "MemAvailable / {} processes on this host",
                place.local_world_size
            );
        }
    }
    let (device_bytes, device_source) = match opts.gpu_mem_gib {
        Some(gib) => (Some((gib * GIB) as u64), "--gpu-mem-gib".to_string()),
        None => gpu_free_bytes(&lane_gpus(opts))?,
    };
    Ok(Machine {
        host_bytes,
        host_source,
        device_bytes,
        device_source,
    })
}

/// The GPUs this process's lanes run on: 0..`--gpus`, or in a run of
/// several processes, `--local-rank`'s.
fn lane_gpus(opts: &TrainOptions) -> Vec<usize> {
    match &opts.processes {
        Some(place) => vec![place.local_rank],
        None => (0..opts.gpus).collect(),
    }
}

/// Processes in the run (1 without `--world-size`).
fn world_size(opts: &TrainOptions) -> usize {
    opts.processes.as_ref().map_or(1, |p| p.world_size)
}

/// Whether this process writes the run's outputs: checkpoints, metrics,
/// the export and the sample (rank 0 of several).
fn writes_outputs(opts: &TrainOptions) -> bool {
    opts.processes.as_ref().is_none_or(|p| p.rank == 0)
}

/// The free memory of the most loaded of `gpus` (each runs the same lane
/// of the plan).
#[cfg(feature = "cuda")]
fn gpu_free_bytes(gpus: &[usize]) -> Result<(Option<u64>, String)> {
    check_gpus(gpus)?;
    let mut least = (u64::MAX, 0);
    for &index in gpus {
        let free = burn_offload::cuda_backend::free_device_bytes(index)
            .map_err(|e| anyhow::anyhow!("cannot query GPU memory: {e}"))?;
        least = least.min((free, index));
    }
    let source = if gpus.len() == 1 {
        format!("free on GPU {} (CUDA driver)", least.1)
    } else {
        format!(
            "free on GPU {} of 0..{}, the least (CUDA driver)",
            least.1,
            gpus.len()
        )
    };
    Ok((Some(least.0), source))
}

#[cfg(not(feature = "cuda"))]
fn gpu_free_bytes(_: &[usize]) -> Result<(Option<u64>, String)> {
    Ok((None, "CPU backend".into()))
}

/// Refuses GPUs beyond those the driver sees.
#[cfg(feature = "cuda")]
fn check_gpus(gpus: &[usize]) -> Result<()> {
    let count = burn_offload::cuda_backend::device_count()
        .map_err(|e| anyhow::anyhow!("cannot count CUDA devices: {e}"))?;
    match gpus {
        [index] if *index >= count => {
            bail!("--local-rank {index} needs GPU {index}, and the CUDA driver sees {count}")
        }
        _ if gpus.len() > count => bail!(
            "--gpus {} asks for more GPUs than the {count} the CUDA driver sees",
            gpus.len()
        ),
        _ => Ok(()),
    }
}

/// The devices the engine trains on: [`lane_gpus`] on CUDA.
#[cfg(feature = "cuda")]
fn lane_devices(opts: &TrainOptions) -> Result<Vec<DefaultDevice>> {
    let gpus = lane_gpus(opts);
    check_gpus(&gpus)?;
    Ok(gpus
        .into_iter()
        .map(burn::backend::cuda::CudaDevice::new)
        .collect())
}

/// The devices the engine trains on: on CPU backends, `--gpus` logical
/// devices (the one device, a lane each: the data-parallel schedule without
/// GPUs), or one for each process of several.
#[cfg(not(feature = "cuda"))]
fn lane_devices(opts: &TrainOptions) -> Result<Vec<DefaultDevice>> {
    Ok(vec![Default::default(); lane_gpus(opts).len()])
}

type DefaultDevice = burn::tensor::Device<DefaultBackend>;

/// Bytes reserved by the GPU allocator's pools on the first GPU the run
/// trains on (CUDA builds).
fn gpu_reserved_bytes(opts: &TrainOptions) -> Option<u64> {
    #[cfg(feature = "cuda")]
    return Some(
        burn_offload::cuda_backend::pool_bytes(&burn::backend::cuda::CudaDevice::new(
            lane_gpus(opts)[0],
        ))
        .1,
    );
    #[cfg(not(feature = "cuda"))]
    {
        let _ = opts;
        None
    }
}

/// The memory plan of this job on `machine` (nothing is allocated).
pub fn plan(opts: &TrainOptions, config: ModelConfig, machine: &Machine) -> (Plan, PlanJob) {
    let job = PlanJob {
        config,
        batch: opts.batch,
        seq_len: opts.seq_len,
        accum: opts.accum,
        gpus: opts.gpus,
        fused: opts.fused,
        resident: opts.resident,
        host_params: opts.host_params,
        compute: opts.compute,
        loss_chunk_tokens: opts.loss_chunk_tokens,
        gpu: cfg!(feature = "cuda"),
        block_inputs: opts.block_inputs,
        kept_graphs: opts.kept_graphs,
        kept_attention: 0,
        host_layout: opts.host_layout,
        optim_state: opts.optim_state,
        gradient_blocks_in_flight: GRADIENT_BLOCKS_IN_FLIGHT,
        mlp_tile: None,
        param_cache: match opts.param_cache_gib {
            Some(gib) => ParamCache::Bytes((gib * GIB) as u64),
            None => ParamCache::Auto,
        },
    };
    let job = job.placed(machine);
    (Plan::new(&job), job)
}

/// The longest sequence, in whole thousands (1024) of tokens, whose plan
/// fits `machine` at batch 1 with the job's other settings (the same
/// choices made for it); `None` when not even 1024 tokens fit.
pub fn longest_sequence(job: &PlanJob, machine: &Machine) -> Option<usize> {
    let fits = |k: usize| {
        let candidate = PlanJob {
            batch: 1,
            seq_len: k * 1024,
            block_inputs: BlockInputs::Auto,
            kept_graphs: KeptGraphs::Auto,
            mlp_tile: None,
            ..job.clone()
        };
        let candidate = candidate.placed(machine);
        Plan::new(&candidate).check(&candidate, machine).is_ok()
    };
    if !fits(1) {
        return None;
    }
    // Memory grows with the sequence: the last that fits, by bisection
    // below the first of the doublings that does not (up to 16M tokens).
    let (mut lo, mut hi) = (1, 2);
    while hi <= 1 << 14 && fits(hi) {
        (lo, hi) = (hi, 2 * hi);
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo * 1024)
}

/// `train --plan`: the table of predicted memory against the machine, and
/// the longest sequence these settings fit.
pub fn plan_table(opts: &TrainOptions) -> Result<String> {
    let (_, config) = checked_model(opts)?;
    let machine = machine(opts)?;
    let (plan, job) = plan(opts, config, &machine);
    let mut table = plan.table(&machine);
    match plan.check(&job, &machine) {
        Ok(()) => table.push_str("fits\n"),
        Err(why) => table.push_str(&format!("does not fit: {why}\n")),
    }
    if let Some(tile) = job.mlp_tile {
        table.push_str(&format!("MLP over tiles of {tile} tokens\n"));
    }
    if let Some(links) = crate::links::Links::of(&job) {
        table.push_str(&links.describe());
    }
    match longest_sequence(&job, &machine) {
        Some(tokens) => table.push_str(&format!(
            "longest sequence that fits at batch 1: {tokens} tokens (the model's max_seq_len: {})\n",
            job.config.max_seq_len()
        )),
        None => table.push_str("no sequence of 1024 tokens fits at batch 1\n"),
    }
    Ok(table)
}

/// Refuses, before anything is allocated, a job that does not fit the
/// machine; otherwise the job with its block inputs placed and its kept
/// graphs counted.
fn check_memory(opts: &TrainOptions, config: &ModelConfig) -> Result<PlanJob> {
    let machine = machine(opts)?;
    let (plan, job) = plan(opts, config.clone(), &machine);
    plan.check(&job, &machine).map_err(anyhow::Error::msg)?;
    Ok(job)
}

struct Job<'a> {
    opts: &'a TrainOptions,
    tokenizer: &'a Tokenizer,
    batcher: Batcher,
    metrics: Option<MetricsFile>,
    /// The checkpoint folder, locked for this run.
    checkpoints: Option<CheckpointDir>,
    /// The checkpoint the run continues from, already checked against it.
    resume: Option<Resume>,
    config: ModelConfig,
    /// (tokens, crc32) of the training token stream.
    corpus: (usize, u32),
    /// Where the engine keeps block inputs (decided by the memory plan).
    block_inputs: BlockInputs,
    /// Blocks whose forward graph the engine keeps (decided by the memory plan).
    kept_graphs: usize,
    /// How many recomputed blocks keep their attention outputs (decided by
    /// the memory plan).
    kept_attention: usize,
    /// Blocks whose gradients may wait on the device (counted by the memory plan).
    gradient_blocks_in_flight: usize,
    /// The compact host layout: weights cast on the device (decided by the
    /// memory plan).
    cast_on_device: bool,
    /// With it and one micro-batch, the blocks' gradients kept in the compute
    /// precision (decided by the memory plan).
    compute_precision_gradients: bool,
    /// When the model began to be built (initialisation time is reported).
    building: Instant,
    /// The run's processes, when it has several.
    group: Option<Arc<ProcessGroup>>,
}

impl Job<'_> {
    fn schedule(&self) -> WarmupCosine {
        WarmupCosine {
            peak: self.opts.lr,
            warmup: self.opts.warmup.min(self.opts.steps),
            total: self.opts.steps,
            min_ratio: self.opts.min_lr_ratio,
        }
    }

    fn state(&self, steps_done: usize, skipped_total: usize) -> TrainerState {
        TrainerState {
            model: self.config.clone(),
            tokenizer: self.tokenizer.name().to_string(),
            batch: self.opts.batch,
            seq_len: self.opts.seq_len,
            accum: self.opts.accum,
            gpus: self.opts.gpus,
            processes: world_size(self.opts),
            steps_done,
            skipped_total,
            batcher_rng: self.batcher.rng_state(),
            corpus_tokens: self.corpus.0,
            corpus_crc32: self.corpus.1,
        }
    }

    /// Offload engine: parameters and AdamW state in host slabs, blocks streamed.
    fn train_engine<B, M>(
        mut self,
        (model, rng): (M, MutexGuard<'static, ()>),
        devices: &[B::Device],
    ) -> Result<Outcome>
    where
        B: Backend,
        M: BlockModel<B> + HasAutodiffModule<Autodiff<B>>,
        M::TrainModule: BlockModel<Autodiff<B>>,
        M::Block: HasAutodiffModule<Autodiff<B>>,
        <M::Block as HasAutodiffModule<Autodiff<B>>>::TrainModule: DecoderBlock<Autodiff<B>>,
    {
        let opts = self.opts;
        let config = EngineConfig {
            optimizer: OptimizerConfig::AdamW(burn_offload::AdamWConfig {
                weight_decay: opts.weight_decay as f32,
                ..Default::default()
            }),
            grad_clip: (opts.grad_clip > 0.0).then_some(opts.grad_clip),
            fused: opts.fused,
            loss_chunk_tokens: opts.loss_chunk_tokens,
            skip_non_finite: !opts.no_guard,
            overlap: !opts.serial_copies,
            host_checkpoints: self.block_inputs == BlockInputs::Host,
            compute: opts.compute,
            cast_on_device: self.cast_on_device,
            compute_precision_gradients: self.compute_precision_gradients,
            eight_bit_moments: opts.optim_state == OptimState::EightBit,
            kept_graphs: self.kept_graphs,
            kept_attention: self.kept_attention,
            blocking_sync: !opts.spin_waits,
            hold_updates_for_copies: !opts.updates_during_copies,
            gradient_blocks_in_flight: self.gradient_blocks_in_flight,
        };
        let device = &devices[0];
        let mut engine = Engine::on_devices(model, config, devices)?;
        drop(rng);
        trace::mark("host store ready");
        if opts.progress {
            let copies = engine.compute_copy_bytes();
            let store = engine.store();
            eprintln!(
                "host store ready: {} parameters, {:.2} GiB ({:.1} B/param) in {:.1} s; host peak so far {:.2} GiB",
                human_count(store.num_params()),
                store.host_bytes() as f64 / GIB,
                store.bytes_per_param(),
                self.building.elapsed().as_secs_f64(),
                peak_rss_bytes().unwrap_or(0) as f64 / GIB,
            );
            if self.kept_graphs > 0 {
                eprintln!(
                    "the last {} of {} blocks keep their forward graph on the device (not recomputed)",
                    self.kept_graphs,
                    self.config.n_layer()
                );
            }
            if self.kept_attention > 0 {
                let recomputed =
                    self.config.n_layer() - self.kept_graphs.min(self.config.n_layer());
                eprintln!(
                    "{} of {recomputed} recomputed blocks take their attention outputs from the forward",
                    self.kept_attention.min(recomputed)
                );
            }
            if copies > 0 {
                eprintln!(
                    "{} weights for upload: {:.2} GiB beside the fp32 store",
                    opts.compute,
                    copies as f64 / GIB
                );
            }
        }
        let mut outcome = Outcome::default();
        if let Some(resume) = self.resume.take() {
            engine.load_checkpoint(&resume.path)?;
            self.batcher.set_rng_state(resume.state.batcher_rng);
            outcome.start_step = resume.state.steps_done;
            outcome.skipped_total = resume.state.skipped_total;
            if let Some(metrics) = self.metrics.as_mut() {
                metrics.line(&ResumeMarker {
                    resumed_from: &resume.path,
                    step: outcome.start_step,
                })?;
            }
            if opts.progress {
                eprintln!(
                    "resumed from `{}` at step {} of {}",
                    resume.path.display(),
                    outcome.start_step,
                    opts.steps
                );
            }
        }
        // Every process holds the same store from here on (checked).
        if let Some(group) = &self.group {
            engine.join_processes(group.clone())?;
        }
        let schedule = self.schedule();
        let mut progress = self.progress(outcome.start_step);
        let lanes = devices.len() * world_size(opts);
        let tokens_per_step = (opts.batch * opts.seq_len * opts.accum * lanes) as f64;
        let params = engine.store().num_params() as u64;
        let block_params = params - engine.store().groups[0].numel() as u64;
        let config = engine.config();
        let passes = if config.fused && (config.grad_clip.is_some() || config.skip_non_finite) {
            2.0
        } else {
            1.0
        };
        let model_flops = 6.0 * params as f64 * tokens_per_step;
        // The recompute covers the blocks whose graph the forward did not keep.
        let blocks = self.config.n_layer();
        let recomputed = (blocks - config.kept_graphs.min(blocks)) as f64 / blocks.max(1) as f64;
        // Causal attention's products, `seq² × width` FLOPs each a sequence
        // and layer (half the square's multiply-adds): two forward, two more
        // where the block is recomputed, five backward (the scores again,
        // the probabilities', values', queries' and keys' gradients).
        let sequences = (opts.batch * opts.accum * lanes) as f64;
        let attention_product = sequences
            * (opts.seq_len as f64).powi(2)
            * self.config.attention_width() as f64
            * blocks as f64;
        let hardware_flops = passes
            * (model_flops
                + 2.0 * recomputed * block_params as f64 * tokens_per_step
                + (7.0 + 2.0 * recomputed) * attention_product);
        let mut consecutive_skips = 0;
        let mut step = outcome.start_step;
        // Steps done since the last checkpoint was written.
        let mut unsaved = false;
        loop {
            // The one way out: the end, --stop-after or a signal, each with
            // a checkpoint of whatever is not saved yet.
            // Every process stops at the same step, with rank 0's checkpoint.
            let signal = match &self.group {
                Some(group) => agree_on_signal(group, signals::requested())?,
                None => signals::requested(),
            };
            if signal.is_some() || step == opts.steps || opts.stop_after == Some(step) {
                if unsaved {
                    outcome.checkpoint = self
                        .checkpoint(step, outcome.skipped_total, |dir, state| {
                            engine.save_checkpoint(dir, state)
                        })?
                        .or(outcome.checkpoint);
                }
                outcome.interrupted = signal;
                break;
            }
            let started = Instant::now();
            let lr = schedule.lr(step);
            // Rounds of one micro-batch per lane of the run, each drawn on
            // its device (every process draws them all).
            let mut trained_tokens = 0;
            let mut documents = Vec::new();
            let batches: Vec<_> = (0..opts.accum * lanes)
                .map(|i| {
                    let (inputs, targets, trained, docs) =
                        self.batch_tensors::<B>(&devices[i % devices.len()]);
                    trained_tokens += trained;
                    documents.extend(docs);
                    (inputs, targets)
                })
                .collect();
            if opts.poison_at_step == Some(step) {
                engine.store_mut().groups[0]
                    .params
                    .as_mut_slice()
                    .fill(f32::NAN);
            }
            engine.reset_pager_counters();
            let peak_reset = trace::reset_peak();
            trace::mark(format_args!("step {step}: batches ready"));
            // Packed instruction windows carry their examples' boundaries
            // (every micro-batch of the batcher, or none).
            let report = if documents.len() == batches.len() {
                engine.step_in(&batches, &documents, lr)?
            } else {
                engine.step(&batches, lr)?
            };
            if report.skipped {
                consecutive_skips += 1;
                outcome.skipped_total += 1;
            } else {
                consecutive_skips = 0;
            }
            if opts.no_guard && !report.loss.is_finite() {
                bail!(
                    "loss became {} at step {step} and --no-guard applied the update; \
                     resume from the last checkpoint with a lower --lr",
                    report.loss
                );
            }
            outcome.losses.push(report.loss);
            let pager = engine.pager_stats();
            let step_s = started.elapsed().as_secs_f64();
            let tokens_per_s = tokens_per_step / step_s;
            self.log(&StepMetrics {
                step,
                loss: report.loss,
                trained_tokens,
                lr,
                tokens_per_s,
                step_s,
                params,
                model_tflops: model_flops / step_s * 1e-12,
                hardware_tflops: hardware_flops / step_s * 1e-12,
                rss_bytes: process_rss_bytes(),
                rss_peak_bytes: peak_reset.then(peak_rss_bytes).flatten(),
                grad_norm: report.grad_norm.is_finite().then_some(report.grad_norm),
                bytes_to_device: Some(pager.bytes_to_device),
                bytes_to_host: Some(pager.bytes_to_host),
                peak_device_param_bytes: Some(pager.peak_resident_bytes),
                upload_wait_s: Some(pager.upload_wait_ns as f64 * 1e-9),
                split: Some(report.split),
                gpu_reserved_bytes: gpu_reserved_bytes(opts),
                host_update_s: None,
                paged_in_bytes: None,
                skipped: report.skipped,
                skipped_total: outcome.skipped_total,
            })?;
            if consecutive_skips >= opts.max_skips {
                bail!(
                    "stopped: {consecutive_skips} consecutive steps had a non-finite loss or gradient (last loss {}, \
                     gradient norm {}); parameters are as after step {}; lower --lr or check the data",
                    report.loss,
                    report.grad_norm,
                    step + 1 - consecutive_skips
                );
            }
            trace::mark(format_args!("step {step}: logged"));
            progress.step(StepLine {
                done: step + 1,
                loss: report.loss,
                tokens_per_s,
                trained_tokens,
            });
            step += 1;
            unsaved = true;
            signals::update(|progress| progress.steps_done = step);
            if opts.checkpoint_every > 0 && step % opts.checkpoint_every == 0 {
                outcome.checkpoint =
                    self.checkpoint(step, outcome.skipped_total, |dir, state| {
                        engine.save_checkpoint(dir, state)
                    })?;
                unsaved = false;
            }
        }
        progress.finish();
        if outcome.interrupted.is_some() {
            // Stop promptly: the run is not finished, so neither export nor sample.
            return Ok(outcome);
        }
        if !writes_outputs(opts) {
            return Ok(outcome);
        }
        if self.opts.export_hf.is_some() {
            // The export needs the whole model as burn modules on the device.
            outcome.exported = self.export(&engine.model())?;
        }
        if !outcome.losses.is_empty() {
            // Sampling streams the blocks like training does: a model larger
            // than the device is never assembled on it.
            outcome.sample = self.sample(device, |tokens| Ok(engine.last_logits(&tokens)?))?;
        }
        Ok(outcome)
    }

    /// Writes a checkpoint after `steps_done` steps with `save` (the engine's),
    /// when the run has a checkpoint folder; returns its path.
    fn checkpoint(
        &mut self,
        steps_done: usize,
        skipped_total: usize,
        save: impl FnOnce(
            &mut CheckpointDir,
            serde_json::Value,
        ) -> std::result::Result<PathBuf, CheckpointError>,
    ) -> Result<Option<PathBuf>> {
        let state = serde_json::to_value(self.state(steps_done, skipped_total))?;
        let Some(dir) = self.checkpoints.as_mut() else {
            return Ok(None);
        };
        let path = save(dir, state)?;
        signals::update(|progress| progress.saved = Some((path.clone(), steps_done)));
        Ok(Some(path))
    }

    /// Writes `model` to `--export-hf` as a whole Hugging Face folder (see
    /// [`export`]); returns where it went.
    fn export<B: Backend, M: burn::module::Module<B>>(&self, model: &M) -> Result<Option<PathBuf>> {
        let Some(dir) = &self.opts.export_hf else {
            return Ok(None);
        };
        let init_from = self.opts.init_from.as_deref();
        let source_config = match init_from {
            Some(dir) => Some(models::hf::read_json(&dir.join("config.json"))?),
            None => None,
        };
        let ids = export::special_token_ids(source_config.as_ref(), self.tokenizer);
        export::write(dir, |staging| {
            models::hf::save_weights(model, &self.config, staging)?;
            export::write_configs(
                staging,
                models::hf::hf_config(&self.config),
                &ids,
                init_from,
            )?;
            for file in self.tokenizer.files() {
                let name = file.file_name().expect("a file");
                std::fs::copy(file, staging.join(name)).map_err(|e| {
                    anyhow::anyhow!("--export-hf: cannot copy `{}`: {e}", file.display())
                })?;
            }
            Ok(())
        })?;
        Ok(Some(dir.clone()))
    }

    /// The resident model's export and sample.
    fn finish<B: Backend, M: BlockModel<B>>(
        &mut self,
        model: &M,
        device: &B::Device,
    ) -> Result<(Option<PathBuf>, String)> {
        let exported = self.export(model)?;
        let sample = self.sample(device, |tokens| Ok(last_logits(model, tokens)))?;
        Ok((exported, sample))
    }

    /// Text generated from "The " with `logits` (last-position logits of a batch of one).
    fn sample<B: Backend>(
        &self,
        device: &B::Device,
        logits: impl FnMut(Tensor<B, 2, Int>) -> Result<Tensor<B, 2>>,
    ) -> Result<String> {
        let prompt = self.tokenizer.encode("The ");
        let opts = self.opts;
        let ids = generate(
            logits,
            &prompt,
            opts.sample_tokens,
            opts.seq_len,
            opts.temperature,
            opts.seed,
            device,
        )?;
        Ok(self.tokenizer.decode(&ids))
    }

    /// Plain burn: `Autodiff` over the whole model and `optim` (burn-optim's
    /// AdamW, or the host AdamW over `Offload<B>`; clipping per parameter
    /// tensor, not global). In bf16 the f32 parameters are cast for each
    /// forward and the gradients arrive in f32.
    fn train_resident<AB, M, O>(
        mut self,
        mut model: M,
        mut optim: O,
        device: &AB::Device,
    ) -> Result<Outcome>
    where
        AB: AutodiffBackend,
        M: BlockModel<AB> + AutodiffModule<AB>,
        M::InnerModule: BlockModel<AB::InnerBackend>,
        O: Optimizer<M, AB>,
    {
        let opts = self.opts;
        let schedule = self.schedule();
        let mut progress = self.progress(0);
        let tokens_per_step = (opts.batch * opts.seq_len * opts.accum) as f64;
        let params = model.num_params() as u64;
        let flops = 6.0 * params as f64 * tokens_per_step;
        let mut losses = Vec::with_capacity(opts.steps);
        // With --accum the graph holds one micro-batch's activations at a
        // time; the gradients are summed into a second set of parameter-sized
        // tensors (burn's accumulator, which takes a single micro-batch's as
        // they are), each micro-batch's mean loss weighted by its share of
        // the step's trained targets, so the sum is the mean over the step's
        // trained tokens, as in the engine.
        let mut accumulator = GradientsAccumulator::<M>::new();
        // BURN_OFFLOAD_RESIDENT_SPLIT=1: wait for the device after each
        // phase, so the step's split (forward with head and loss, backward,
        // optimizer) is device time, to set beside the engine's. The waits
        // cost the overlap of one phase's launches with the last one's tail,
        // so these rows are for the split, not for tokens/s.
        let timed = std::env::var("BURN_OFFLOAD_RESIDENT_SPLIT").is_ok_and(|v| v == "1");
        let mark = |to: &mut f64, since: &mut Instant| -> Result<()> {
            if timed {
                AB::sync(device).map_err(|e| anyhow::anyhow!("device sync failed: {e:?}"))?;
                *to += since.elapsed().as_secs_f64();
                *since = Instant::now();
            }
            Ok(())
        };

        for step in 0..opts.steps {
            if let Some(signal) = signals::requested() {
                // No checkpoints in this mode: stop, without export or sample.
                progress.finish();
                return Ok(Outcome {
                    losses,
                    interrupted: Some(signal),
                    ..Outcome::default()
                });
            }
            let started = Instant::now();
            let (updating, paged) = (
                burn_offload::host_update_stats().updating,
                burn_offload::residency::stats().bytes_to_device,
            );
            let mut phase = Instant::now();
            let mut split = burn_offload::StepSplit::default();
            let lr = schedule.lr(step);
            let mut loss_value = 0.0f32;
            let micro_batches: Vec<_> = (0..opts.accum)
                .map(|_| self.batcher.next_batch_in(opts.batch))
                .collect();
            let trained_tokens: usize = micro_batches
                .iter()
                .map(|(_, t, _)| trained_targets(t))
                .sum();
            for (inputs, targets, documents) in micro_batches {
                let scale = trained_targets(&targets) as f64 / trained_tokens.max(1) as f64;
                let tensor = |v: Vec<i64>| {
                    Tensor::from_data(TensorData::new(v, [opts.batch, opts.seq_len]), device)
                };
                let (inputs, targets) = (tensor(inputs), tensor(targets));
                // Packed instruction windows: each example sees only itself.
                let forward = |model: &M| match &documents {
                    Some(documents) => model.forward_in(inputs.clone(), documents),
                    None => model.forward(inputs.clone()),
                };
                let logits = match opts.compute {
                    Compute::Fp32 => forward(&model),
                    low => forward(&burn_offload::cast_params(model.clone(), low.dtype())),
                };
                let loss = cross_entropy(logits, targets) * scale;
                let micro: f32 = loss.clone().into_scalar().elem();
                mark(&mut split.forward_s, &mut phase)?;
                if !micro.is_finite() {
                    bail!("loss became {micro} at step {step}; try a lower --lr");
                }
                loss_value += micro;
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                accumulator.accumulate(&model, grads);
                mark(&mut split.backward_s, &mut phase)?;
            }
            model = optim.step(lr, model, accumulator.grads());
            mark(&mut split.optimizer_s, &mut phase)?;
            losses.push(loss_value);

            let step_s = started.elapsed().as_secs_f64();
            let tokens_per_s = tokens_per_step / step_s;
            let line = StepMetrics {
                step,
                loss: loss_value,
                trained_tokens,
                lr,
                tokens_per_s,
                step_s,
                params,
                model_tflops: flops / step_s * 1e-12,
                hardware_tflops: flops / step_s * 1e-12,
                rss_bytes: process_rss_bytes(),
                rss_peak_bytes: None,
                grad_norm: None,
                bytes_to_device: None,
                bytes_to_host: None,
                peak_device_param_bytes: None,
                upload_wait_s: None,
                split: timed.then_some(split),
                gpu_reserved_bytes: gpu_reserved_bytes(opts),
                host_update_s: opts
                    .host_params
                    .then(|| (burn_offload::host_update_stats().updating - updating).as_secs_f64()),
                paged_in_bytes: opts
                    .host_params
                    .then(|| burn_offload::residency::stats().bytes_to_device - paged),
                skipped: false,
                skipped_total: 0,
            };
            self.log(&line)?;
            progress.step(StepLine {
                done: step + 1,
                loss: loss_value,
                tokens_per_s,
                trained_tokens,
            });
            signals::update(|progress| progress.steps_done = step + 1);
        }
        progress.finish();
        let (exported, sample) = self.finish(&model.valid(), device)?;
        Ok(Outcome {
            losses,
            sample,
            exported,
            ..Outcome::default()
        })
    }

    /// The next micro-batch on `device`, with the number of targets it
    /// trains on and its rows' document boundaries (packed instruction data).
    fn batch_tensors<AB: Backend>(
        &mut self,
        device: &AB::Device,
    ) -> (
        Tensor<AB, 2, Int>,
        Tensor<AB, 2, Int>,
        usize,
        Option<Documents>,
    ) {
        let (batch, seq) = (self.opts.batch, self.opts.seq_len);
        let (inputs, targets, documents) = self.batcher.next_batch_in(batch);
        let trained = trained_targets(&targets);
        let tensor = |v: Vec<i64>| Tensor::from_data(TensorData::new(v, [batch, seq]), device);
        (tensor(inputs), tensor(targets), trained, documents)
    }

    /// The run's progress display from step `start`.
    fn progress(&self, start: usize) -> Progress {
        Progress::new(
            self.opts.progress,
            format!("{} params", human_count(self.config.num_params())),
            start,
            self.opts.steps,
        )
    }

    fn log(&mut self, line: &StepMetrics) -> Result<()> {
        match self.metrics.as_mut() {
            Some(metrics) => metrics.line(line),
            None => Ok(()),
        }
    }
}

/// Continues a short prompt with the trained model: greedy at temperature 0,
/// otherwise sampled (seeded). The window slides over the last `seq_len` tokens.
pub fn generate<B: Backend>(
    mut last_logits: impl FnMut(Tensor<B, 2, Int>) -> Result<Tensor<B, 2>>,
    prompt: &[u32],
    new_tokens: usize,
    seq_len: usize,
    temperature: f64,
    seed: u64,
    device: &B::Device,
) -> Result<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ids = prompt.to_vec();
    for _ in 0..new_tokens {
        let window = &ids[ids.len().saturating_sub(seq_len)..];
        let input: Vec<i64> = window.iter().map(|&t| t as i64).collect();
        let tokens =
            Tensor::<B, 2, Int>::from_data(TensorData::new(input, [1, window.len()]), device);
        let logits: Vec<f32> = last_logits(tokens)?
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap_or_default();
        ids.push(pick_token(&logits, temperature, &mut rng));
    }
    Ok(ids)
}

/// Logits at the last position of each sequence of a resident model, `[batch, vocab]`.
fn last_logits<B: Backend, M: BlockModel<B>>(model: &M, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
    let [batch, seq] = tokens.dims();
    let hidden = model
        .blocks()
        .iter()
        .fold(model.embed(tokens), |x, b| b.forward(x));
    let logits = model.head(hidden.narrow(1, seq - 1, 1));
    let vocab = logits.dims()[2];
    logits.reshape([batch, vocab])
}

fn pick_token(logits: &[f32], temperature: f64, rng: &mut StdRng) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &l)| {
                if l > best.1 {
                    (i, l)
                } else {
                    best
                }
            })
            .0 as u32
    };
    if temperature == 0.0 {
        return argmax();
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let weights: Vec<f64> = logits
        .iter()
        .map(|&l| ((l as f64 - max) / temperature).exp())
        .collect();
    let mut draw = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (i, w) in weights.iter().enumerate() {
        draw -= w;
        if draw <= 0.0 {
            return i as u32;
        }
    }
    argmax()
}
