//! What a run is asked to do: every option `train` takes, their defaults,
//! and the checks they must pass before anything is read or built.

use std::path::PathBuf;

use anyhow::{bail, Result};
use burn_offload::Compute;

use crate::instruct::DataFormat;
use crate::plan::{BlockInputs, HostLayout, KeptGraphs, OptimState};
use crate::processes::RankOptions;

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
    /// [`crate::data::token_cache::default_root`]).
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

pub(crate) fn validate(opts: &TrainOptions) -> Result<()> {
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
