//! What a run is asked to do: every option `train` takes, their defaults,
//! and the checks they must pass before anything is read or built.

use std::collections::BTreeSet;
use std::path::PathBuf;

use burn_offload::Compute;
use clap::parser::ValueSource;

use crate::instruct::DataFormat;
use crate::plan::{BlockInputs, HostLayout, KeptGraphs, OptimState, Recompute};
use crate::processes::{PlaceError, RankOptions};

mod lora;
pub use lora::{LoraOptions, LoraOptionsError};

/// Which implementation runs attention on CUDA in bf16 and f16 (`--attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AttentionKernels {
    /// cuDNN's fused attention where libcudnn 9 is found at run time (and
    /// takes the shape), else the crate's CubeCL kernels.
    Auto,
    /// The crate's CubeCL kernels (and query blocks and key tiles).
    Cubecl,
}

/// Everything a run can be asked to do: `train`'s command line flattens
/// into it (each field's doc is its `--help`), and the library's callers
/// build it with `..Default::default()`, whose values are the flags'
/// defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainOptions {
    /// Model preset (tiny, gpt2-tiny, llama-tiny, gpt2-124m, gpt2-xl, llama-1b,
    /// llama-3b, llama-7b, llama-8b) or a path to a config .json.
    #[arg(long, default_value = "tiny")]
    pub model: String,
    /// Optimizer steps.
    #[arg(long, default_value_t = DEFAULT_STEPS)]
    pub steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 64)]
    pub seq_len: usize,
    /// Peak learning rate (after warm-up; cosine decay afterwards).
    /// Default: 1e-2 from scratch (the built-in tiny model's), 2e-5 with
    /// --init-from (fine-tuning a pretrained model).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Warm-up steps.
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// Final learning rate as a fraction of the peak.
    #[arg(long, default_value_t = 0.1)]
    pub min_lr_ratio: f64,
    /// AdamW decoupled weight decay.
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// AdamW's decay rates of the first and second moments, `B1,B2`, each
    /// in [0, 1) (0.9,0.95 is the usual choice for large language models).
    #[arg(long, value_delimiter = ',', default_value = "0.9,0.999")]
    pub adam_betas: Vec<f32>,
    /// AdamW's epsilon, added to the second moment's root (positive).
    #[arg(long, default_value_t = 1e-5)]
    pub adam_eps: f32,
    /// Gradient-norm clip, 0 disables (global norm in the engine; per tensor with --resident).
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f64,
    /// Seed for initialisation, batches and sampling.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Text file, .jsonl file (field `text`), Parquet file (column `text`)
    /// or directory of them, or instruction data (see --data-format); the
    /// built-in corpus when omitted.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Tokenizer: `byte`, `gpt2` (BPE), or a Hugging Face tokenizer.json
    /// (the file or its folder). Default: the tokenizer.json of --init-from
    /// when it has one, else `byte`.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// What --data holds: `auto` (decided from the files), `text`, or the
    /// instruction formats `alpaca`, `sharegpt`, `chat` (JSON Lines, a JSON
    /// array or Parquet columns), rendered with the tokenizer's chat template.
    #[arg(long, default_value = "auto")]
    pub data_format: DataFormat,
    /// Where tokenized text corpora are cached (keyed by the data files and
    /// the tokenizer; reused by later runs and resumes). Default:
    /// $XDG_CACHE_HOME/burn-offload/tokens or ~/.cache/burn-offload/tokens.
    #[arg(long)]
    pub data_cache: Option<PathBuf>,
    /// Instruction data: train on the prompt's tokens too (by default the
    /// loss covers the assistant's tokens only).
    #[arg(long)]
    pub train_on_prompt: bool,
    /// Instruction data: one example per window, padded, instead of packing
    /// several into each (packed examples keep their boundaries: none
    /// attends to another, positions restart at each).
    #[arg(long = "no-packing", action = clap::ArgAction::SetFalse)]
    pub packing: bool,
    /// Held-out data to evaluate on (the formats of --data): the mean loss
    /// over its trained tokens, forward only, every --eval-every steps and
    /// at the end, in the metrics, the progress and the summary.
    #[arg(long)]
    pub eval_data: Option<PathBuf>,
    /// Evaluate on this fraction of --data (or of the built-in corpus),
    /// which training then never draws: the last tokens of a text corpus,
    /// for instruction data windows spread over it (the same in every run).
    #[arg(long)]
    pub eval_split: Option<f64>,
    /// Steps between evaluations (0: at the end only); needs --eval-data or
    /// --eval-split.
    #[arg(long, default_value_t = 0)]
    pub eval_every: usize,
    /// Keep the checkpoint with the lowest eval loss in --checkpoint-dir
    /// besides the newest --keep (rotation never removes it); a better
    /// evaluation writes a checkpoint at once.
    #[arg(long)]
    pub keep_best: bool,
    /// Write per-step metrics as JSON lines to this file.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Tokens to generate after training.
    #[arg(long, default_value_t = 200)]
    pub sample_tokens: usize,
    /// Sampling temperature (0 = greedy, which repeats itself on small
    /// models).
    #[arg(long, default_value_t = DEFAULT_TEMPERATURE)]
    pub temperature: f64,
    /// Train with plain burn (whole model under Autodiff, burn-optim AdamW with
    /// per-tensor clipping) instead of the block-streamed offload engine.
    #[arg(long)]
    pub resident: bool,
    /// With --resident: the model on burn-offload's `Offload<B>` backend (the
    /// type parameter: parameters in host memory, paged in as operations
    /// read them) and the host AdamW (optimizer state in host memory).
    #[arg(long)]
    pub host_params: bool,
    /// With --host-params: GPU memory for device copies of the host-resident
    /// parameters, in GiB, kept between the forward and the backward of a
    /// step (and the page-ins ahead of use). Default: every parameter's,
    /// when the plan fits the GPU with them, else 1 GiB.
    #[arg(long)]
    pub param_cache_gib: Option<f64>,
    /// With --host-params: run each block as a checkpoint (`on`: only block
    /// inputs kept, in host memory, each block's graph rebuilt in its
    /// backward and its gradients sent to the host as made, so the GPU holds
    /// one block's activations), or keep the whole step's graph on the GPU
    /// (`off`, faster where it fits). `auto`: off when the memory plan fits
    /// the GPU with the whole graph (`--plan` shows the choice).
    #[arg(long, value_enum, default_value = "auto")]
    pub block_recompute: Recompute,
    /// Engine: apply each block's AdamW update as soon as its gradient arrives
    /// (12 host bytes/param instead of 16; no --accum). The gradient norm is
    /// needed before the first update (non-finite guard, clipping), so the
    /// backward runs twice per step.
    #[arg(long)]
    pub fused: bool,
    /// Engine: switch the overlap off, the serialised baseline for benchmarks:
    /// each block's weight copy lands before it computes, and the CPU works on
    /// a block's gradients only while the GPU is idle.
    #[arg(long)]
    pub serial_copies: bool,
    /// Engine on CUDA: let threads that wait for the device spin on a core
    /// (the driver's default) instead of sleeping; a benchmark baseline.
    #[arg(long)]
    pub spin_waits: bool,
    /// Engine: let the host optimizer run while the forward's weight copies
    /// are in flight (sharing host memory bandwidth with them) instead of
    /// waiting for each to land; a benchmark baseline.
    #[arg(long)]
    pub updates_during_copies: bool,
    /// Engine: update without first checking the gradients for non-finite
    /// values. With --fused and --grad-clip 0 the backward then runs once per
    /// step instead of twice; a non-finite loss stops the run after the fact.
    #[arg(long)]
    pub no_guard: bool,
    /// Micro-batches of --batch sequences accumulated per step (with --resident
    /// too: one micro-batch's graph at a time, gradients summed on the device).
    #[arg(long, default_value_t = 1)]
    pub accum: usize,
    /// Devices to train on, data parallel (offload engine only): GPUs
    /// 0..N, each running its own --accum micro-batches of --batch sequences
    /// per step, their gradients summed with NCCL; on the CPU build, N
    /// logical devices on the one CPU.
    #[arg(long, default_value_t = 1)]
    pub gpus: usize,
    /// Precision the device computes in: fp32, or bf16 (weights, activations
    /// and gradients on the device; master weights, Adam state and gradient
    /// accumulation stay f32 on the host; the loss is taken in f32). With
    /// --resident, bf16 casts the f32 parameters for each forward (autocast-like).
    #[arg(long, default_value = "fp32")]
    pub compute: Compute,
    /// The matmul kernel on CUDA: `fast` (the default of CUDA builds: cuBLAS
    /// when libcublas is on LD_LIBRARY_PATH, f32 in TF32 math as burn's own
    /// f32 matmul computes it; else cubek's fastest strategies), `auto` (burn's own choice), `cublas` (f32 in full
    /// f32), `cublas-tf32` (f32 in TF32, as cubek computes it), or one of
    /// cubek's strategies by name, e.g. `matmul_specialized_tma_mma` (a case
    /// the kernel cannot run falls back to burn's). An unknown name lists the others.
    #[arg(long, default_value = burn_offload::DEFAULT_MATMUL)]
    pub matmul: String,
    /// Attention on CUDA in bf16/f16: `auto` (cuDNN's fused attention where
    /// libcudnn.so.9 is on LD_LIBRARY_PATH, as a CUDA install or the
    /// nvidia-cudnn wheel puts it; else the crate's CubeCL kernels) or
    /// `cubecl` (the crate's kernels). The run says once which ran.
    #[arg(long, value_enum, default_value = "auto")]
    pub attention: AttentionKernels,
    /// Engine: tokens per chunk of the LM head and loss.
    #[arg(long, default_value_t = 4096)]
    pub loss_chunk_tokens: usize,
    /// Engine on a GPU: where the block inputs it recomputes from are kept.
    /// `device` saves a copy each way per block and step; `host` keeps GPU
    /// memory flat in depth; `auto` takes `device` when the memory plan
    /// still fits the GPU with them there (`--plan` shows the choice).
    #[arg(long, default_value = "auto")]
    pub block_inputs: BlockInputs,
    /// Engine below fp32 compute: how the host holds the weights for upload
    /// and the gradients. `full`: bf16 weights and an fp32 gradient buffer
    /// (18 B/param; fused 14); `compact`: the fp32 weights cast on the GPU
    /// and, with one micro-batch, the blocks' gradients kept in bf16 as they
    /// arrive (14 B/param; fused 12). Neither changes what clipping sees.
    /// `auto`: compact when full does not fit the host (`--plan` shows it).
    #[arg(long, default_value = "auto")]
    pub host_layout: HostLayout,
    /// Engine: the optimizer's moments in host memory. `fp32`: 8 B/param;
    /// `8bit`: blockwise 8-bit (bitsandbytes' 8-bit Adam scheme: a byte per
    /// value, a scale per 256, a non-linear code), about 2 B/param,
    /// dequantised and quantised again in the update loop.
    #[arg(long, default_value = "fp32")]
    pub optim_state: OptimState,
    /// Engine: how many of the last blocks run their forward under autodiff
    /// and keep the graph on the device until the backward, which then skips
    /// their recompute. `auto`: on a GPU, as many as the memory plan fits in
    /// 90% of the free memory it leaves (`--plan` shows the count); 0 on CPU.
    #[arg(
        long = "keep-graphs",
        id = "keep_graphs",
        value_name = "KEEP_GRAPHS",
        default_value = "auto"
    )]
    pub kept_graphs: KeptGraphs,
    /// Write checkpoints (safetensors + manifest) into this folder: every
    /// --checkpoint-every steps, at the end, and on Ctrl-C.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end and on Ctrl-C/SIGTERM).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: usize,
    /// This run's checkpoints to keep in --checkpoint-dir (the oldest written
    /// are removed; other runs' checkpoints are never touched).
    #[arg(long, default_value_t = 3)]
    pub keep: usize,
    /// Continue from a checkpoint folder (or the newest one inside a folder).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Stop after this many consecutive steps with a non-finite loss or gradient.
    #[arg(long, default_value_t = 5)]
    pub max_skips: usize,
    /// Fine-tune from a Hugging Face checkpoint folder (config.json +
    /// model.safetensors or shards); its config replaces --model.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// After training, write the model as a Hugging Face checkpoint folder
    /// (config.json with the special tokens' ids, generation_config.json,
    /// model.safetensors and the tokenizer's files). A folder that holds
    /// files, or is (or is inside) --init-from, --resume or
    /// --checkpoint-dir, is refused before the first step.
    #[arg(long)]
    pub export_hf: Option<PathBuf>,
    /// Let --export-hf replace a folder that holds files or that the run
    /// starts from (the new folder takes its place once it is complete).
    #[arg(long)]
    pub overwrite: bool,
    /// Stop after this many steps (checkpointing if --checkpoint-dir is set),
    /// keeping --steps as the length of the learning-rate schedule.
    #[arg(long)]
    pub stop_after: Option<usize>,
    /// Host memory the run may use, in GiB (default: MemAvailable).
    #[arg(long)]
    pub host_mem_gib: Option<f64>,
    /// GPU memory the run may use, in GiB (default: free memory on GPU 0).
    #[arg(long)]
    pub gpu_mem_gib: Option<f64>,
    /// LoRA: adapters trained on the frozen model.
    #[command(flatten)]
    pub lora: LoraOptions,
    /// Whether the run reports its progress on stderr (`train` sets it for
    /// rank 0; off for the library's callers by default).
    #[arg(skip)]
    pub progress: bool,
    /// Engine: this process's place in a run of several processes, one GPU
    /// each (`--rank`/`--world-size`, set by the program); `None`: a run of
    /// one process.
    #[arg(skip)]
    pub processes: Option<RankOptions>,
    /// The flags given on `train`'s command line (empty for the library's
    /// callers): a few are refused when given, whatever their value.
    #[arg(skip)]
    pub given: GivenFlags,
    /// The options resolved from `train`'s command line, `--config` file and
    /// the `config.toml` of `--resume` ([`crate::config::resolved`]),
    /// written as `config.toml` into `checkpoint_dir`; `None` (the
    /// library's callers): nothing written.
    #[arg(skip)]
    pub resolved_config: Option<String>,
    /// Fault injection for tests: make the stem parameters NaN before this step.
    #[doc(hidden)]
    #[arg(skip)]
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

/// The flags given on `train`'s command line, by clap id (the field's
/// name): a flag that the rest of the command line would make ignored is
/// refused when given, even at its default value (`--keep 3` without
/// `--checkpoint-dir`). Besides [`TrainOptions`]' own, [`validate`] reads
/// `train`'s flags for a run of several processes: `processes`, `world_size`
/// (given with `rank`), `rendezvous`, `local_rank`, `local_world_size`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GivenFlags(BTreeSet<String>);

impl GivenFlags {
    /// The flags `matches` took from the command line.
    pub fn of(matches: &clap::ArgMatches) -> Self {
        let given =
            |id: &&clap::Id| matches.value_source(id.as_str()) == Some(ValueSource::CommandLine);
        Self(
            matches
                .ids()
                .filter(given)
                .map(|id| id.as_str().to_string())
                .collect(),
        )
    }

    /// These flags and those of clap ids `ids` (the keys of a `--config`
    /// file).
    pub fn with(mut self, ids: impl IntoIterator<Item = String>) -> Self {
        self.0.extend(ids);
        self
    }

    /// Whether the flag of clap id `id` was given.
    pub fn contains(&self, id: &str) -> bool {
        self.0.contains(id)
    }
}

impl Default for TrainOptions {
    /// The flags' defaults: what `train` with no arguments runs.
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            opts: TrainOptions,
        }
        <Defaults as clap::Parser>::parse_from(["train"]).opts
    }
}

impl TrainOptions {
    /// AdamW's settings, as the engine and the host optimizer take them.
    pub fn adamw(&self) -> burn_offload::AdamWConfig {
        burn_offload::AdamWConfig {
            beta_1: self.adam_betas[0],
            beta_2: self.adam_betas[1],
            epsilon: self.adam_eps,
            weight_decay: self.weight_decay as f32,
        }
    }

    /// The same settings for burn-optim's AdamW (the resident loop), with
    /// its per-tensor clipping at `grad_clip`.
    pub fn burn_adamw(&self) -> burn::optim::AdamWConfig {
        let adamw = self.adamw();
        burn::optim::AdamWConfig::new()
            .with_beta_1(adamw.beta_1)
            .with_beta_2(adamw.beta_2)
            .with_epsilon(adamw.epsilon)
            .with_weight_decay(adamw.weight_decay)
            .with_grad_clipping(self.grad_clipping())
    }

    /// Clipping of the resident loops' optimizers at `grad_clip` (per
    /// tensor); `None` when 0 switches it off.
    pub fn grad_clipping(&self) -> Option<burn::grad_clipping::GradientClippingConfig> {
        (self.grad_clip > 0.0).then_some(burn::grad_clipping::GradientClippingConfig::Norm(
            self.grad_clip as f32,
        ))
    }

    /// The peak learning rate: `lr` where given, else the default of a run
    /// from scratch or, with `init_from`, of a fine-tune.
    pub fn lr(&self) -> f64 {
        self.lr.unwrap_or(if self.init_from.is_some() {
            DEFAULT_FINETUNE_LR
        } else {
            DEFAULT_LR
        })
    }
}

/// Options refused before anything is read or built, each naming its flag.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("{0} is an option of the offload engine; drop it or --resident")]
    EngineOnly(&'static str),
    #[error("--processes starts one process per GPU; drop --gpus")]
    ProcessesWithGpus,
    #[error("--rendezvous needs --rank and --world-size (--processes picks its own)")]
    RendezvousWithoutRank,
    #[error("{0} needs --rank and --world-size")]
    NeedsRank(&'static str),
    #[error("{0} needs --checkpoint-dir")]
    NeedsCheckpointDir(&'static str),
    #[error("--temperature has no effect with --sample-tokens 0")]
    TemperatureUnused,
    #[error("--processes must be at least 2, got {0}")]
    TooFewProcesses(usize),
    #[error("--adam-betas takes two decay rates in [0, 1) as B1,B2, got {0:?}")]
    AdamBetas(Vec<f32>),
    #[error("--adam-eps must be a positive number, got {0}")]
    AdamEps(f32),
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("--attention chooses CUDA's attention kernels, and this build runs on the CPU")]
    AttentionOnCpu,
    #[error("--lr must be a positive number, got {0}")]
    Lr(f64),
    #[error("--temperature must be >= 0, got {0}")]
    Temperature(f64),
    #[error("--grad-clip must be a number >= 0 (0 switches clipping off), got {0}")]
    GradClip(f64),
    #[error("--weight-decay must be a number >= 0, got {0}")]
    WeightDecay(f64),
    #[error("{flag} must be a positive number of GiB, got {gib}")]
    MemoryGib { flag: &'static str, gib: f64 },
    /// `--rank`, `--world-size` and the local ones that cannot be.
    #[error(transparent)]
    Place(#[from] PlaceError),
    /// The LoRA flags that cannot be.
    #[error(transparent)]
    Lora(#[from] LoraOptionsError),
    #[error(
        "--gpus {gpus} with {world}: a run of several processes trains on one GPU each; start \
         one process per GPU"
    )]
    GpusWithWorldSize { gpus: usize, world: &'static str },
    #[error("--host-layout compact applies to a compute precision below fp32 (--compute bf16)")]
    CompactAtFp32,
    #[error("--host-params is an option of plain burn training; add --resident")]
    HostParamsWithoutResident,
    #[error(
        "--param-cache-gib sizes the cache of --host-params (the type parameter's path); add \
         --resident --host-params"
    )]
    ParamCacheWithoutHostParams,
    #[error(
        "--block-recompute chooses how --host-params (the type parameter's path) runs its \
         blocks; add --resident --host-params"
    )]
    BlockRecomputeWithoutHostParams,
    #[error("--param-cache-gib must be a positive number of GiB, not {0}")]
    ParamCacheGib(f64),
    #[error("checkpoints are written from the offload engine's host store; drop --resident")]
    ResidentCheckpoints,
    #[error(
        "--fused cannot accumulate --accum {0} micro-batches: it applies each block's update as \
         the backward reaches it; drop --fused or --accum"
    )]
    FusedAccum(usize),
    #[error("--overwrite lets --export-hf replace a folder; add --export-hf or drop it")]
    OverwriteWithoutExport,
    #[error("--keep must be at least 1 (the newest checkpoint is always kept)")]
    KeepZero,
    #[error("--stop-after {stop} is beyond --steps {steps}")]
    StopAfterBeyondSteps { stop: usize, steps: usize },
    #[error("--min-lr-ratio must be in [0, 1], got {0}")]
    MinLrRatio(f64),
    #[error("{0} needs --eval-data or --eval-split")]
    NeedsEval(&'static str),
    #[error("--eval-split must be a fraction between 0 and 1 (both excluded), got {0}")]
    EvalSplit(f64),
    #[error("--eval-split holds out part of --data; give it or --eval-data, not both")]
    EvalSplitWithEvalData,
}

/// The offload engine's options, each with whether it is given or set:
/// refused with `--resident`.
fn engine_only(opts: &TrainOptions) -> [(&'static str, bool); 15] {
    let given = |id: &str| opts.given.contains(id);
    [
        ("--processes", given("processes")),
        ("--max-skips", given("max_skips")),
        ("--loss-chunk-tokens", given("loss_chunk_tokens")),
        ("--block-inputs", given("block_inputs")),
        ("--keep-graphs", given("keep_graphs")),
        (
            "--host-layout",
            given("host_layout") || opts.host_layout == HostLayout::Compact,
        ),
        (
            "--optim-state",
            given("optim_state") || opts.optim_state == OptimState::EightBit,
        ),
        ("--fused", opts.fused),
        ("--serial-copies", opts.serial_copies),
        ("--spin-waits", opts.spin_waits),
        ("--updates-during-copies", opts.updates_during_copies),
        ("--no-guard", opts.no_guard),
        ("--stop-after", opts.stop_after.is_some()),
        ("--gpus", opts.gpus > 1),
        (
            opts.processes
                .as_ref()
                .map_or("--world-size", |p| p.source.world_size_name()),
            opts.processes.is_some(),
        ),
    ]
}

/// Every rule the options obey, the one place a flag's refusals are
/// written: first the flags that the rest would make ignored (refused
/// rather than silently dropped), then each value, then what cannot go
/// together. `train` runs it before anything else, and every run (and
/// `--plan`) before it reads anything.
pub fn validate(opts: &TrainOptions) -> Result<(), OptionsError> {
    use OptionsError as E;
    let given = |id: &str| opts.given.contains(id);
    if let Some((flag, _)) = engine_only(opts)
        .iter()
        .find(|(_, set)| opts.resident && *set)
    {
        return Err(E::EngineOnly(flag));
    }
    if given("processes") && opts.gpus > 1 {
        return Err(E::ProcessesWithGpus);
    }
    if !given("world_size") {
        if given("rendezvous") {
            return Err(E::RendezvousWithoutRank);
        }
        for (id, flag) in [
            ("local_rank", "--local-rank"),
            ("local_world_size", "--local-world-size"),
        ] {
            if given(id) {
                return Err(E::NeedsRank(flag));
            }
        }
    }
    if opts.checkpoint_dir.is_none() {
        if given("keep") {
            return Err(E::NeedsCheckpointDir("--keep"));
        }
        if given("checkpoint_every") || opts.checkpoint_every > 0 {
            return Err(E::NeedsCheckpointDir("--checkpoint-every"));
        }
    }
    if opts.eval_data.is_none() && opts.eval_split.is_none() {
        let eval_every = given("eval_every") || opts.eval_every > 0;
        for (flag, set) in [
            ("--eval-every", eval_every),
            ("--keep-best", opts.keep_best),
        ] {
            if set {
                return Err(E::NeedsEval(flag));
            }
        }
    }
    if opts.keep_best && opts.checkpoint_dir.is_none() {
        return Err(E::NeedsCheckpointDir("--keep-best"));
    }
    if given("temperature") && opts.sample_tokens == 0 {
        return Err(E::TemperatureUnused);
    }
    match &opts.processes {
        Some(place) if given("processes") && place.world_size < 2 => {
            return Err(E::TooFewProcesses(place.world_size))
        }
        _ => {}
    }
    match opts.adam_betas[..] {
        [b1, b2] if (0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2) => {}
        _ => return Err(E::AdamBetas(opts.adam_betas.clone())),
    }
    if !(opts.adam_eps.is_finite() && opts.adam_eps > 0.0) {
        return Err(E::AdamEps(opts.adam_eps));
    }
    let positive = [
        ("--accum", opts.accum),
        ("--gpus", opts.gpus),
        ("--loss-chunk-tokens", opts.loss_chunk_tokens),
        ("--steps", opts.steps),
        ("--batch", opts.batch),
        ("--seq-len", opts.seq_len),
    ];
    if let Some((flag, _)) = positive.iter().find(|(_, value)| *value == 0) {
        return Err(E::Zero(flag));
    }
    if !cfg!(feature = "cuda") && opts.attention != AttentionKernels::Auto {
        return Err(E::AttentionOnCpu);
    }
    if !(opts.lr().is_finite() && opts.lr() > 0.0) {
        return Err(E::Lr(opts.lr()));
    }
    if !(opts.temperature.is_finite() && opts.temperature >= 0.0) {
        return Err(E::Temperature(opts.temperature));
    }
    if !(opts.grad_clip.is_finite() && opts.grad_clip >= 0.0) {
        return Err(E::GradClip(opts.grad_clip));
    }
    if !(opts.weight_decay.is_finite() && opts.weight_decay >= 0.0) {
        return Err(E::WeightDecay(opts.weight_decay));
    }
    for (flag, gib) in [
        ("--host-mem-gib", opts.host_mem_gib),
        ("--gpu-mem-gib", opts.gpu_mem_gib),
    ] {
        if let Some(gib) = gib.filter(|g| !(g.is_finite() && *g > 0.0)) {
            return Err(E::MemoryGib { flag, gib });
        }
    }
    if let Some(place) = &opts.processes {
        place.validate()?;
        if opts.gpus > 1 {
            return Err(E::GpusWithWorldSize {
                gpus: opts.gpus,
                world: place.source.world_size_name(),
            });
        }
    }
    if opts.host_layout == HostLayout::Compact && opts.compute == Compute::Fp32 {
        return Err(E::CompactAtFp32);
    }
    if opts.host_params && !opts.resident {
        return Err(E::HostParamsWithoutResident);
    }
    if opts.given.contains("block_recompute") && !opts.host_params {
        return Err(E::BlockRecomputeWithoutHostParams);
    }
    if let Some(gib) = opts.param_cache_gib {
        if !opts.host_params {
            return Err(E::ParamCacheWithoutHostParams);
        }
        if !(gib > 0.0 && gib.is_finite()) {
            return Err(E::ParamCacheGib(gib));
        }
    }
    if opts.resident && (opts.checkpoint_dir.is_some() || opts.resume.is_some()) {
        return Err(E::ResidentCheckpoints);
    }
    if opts.fused && opts.accum > 1 {
        return Err(E::FusedAccum(opts.accum));
    }
    lora::validate(&opts.lora, given, opts.resident, opts.export_hf.is_some())?;
    if opts.overwrite && opts.export_hf.is_none() {
        return Err(E::OverwriteWithoutExport);
    }
    if opts.keep == 0 {
        return Err(E::KeepZero);
    }
    match opts.stop_after {
        Some(0) => return Err(E::Zero("--stop-after")),
        Some(stop) if stop > opts.steps => {
            return Err(E::StopAfterBeyondSteps {
                stop,
                steps: opts.steps,
            })
        }
        _ => {}
    }
    if opts.max_skips == 0 {
        return Err(E::Zero("--max-skips"));
    }
    if !(0.0..=1.0).contains(&opts.min_lr_ratio) {
        return Err(E::MinLrRatio(opts.min_lr_ratio));
    }
    if let Some(fraction) = opts.eval_split {
        if !(fraction > 0.0 && fraction < 1.0) {
            return Err(E::EvalSplit(fraction));
        }
        if opts.eval_data.is_some() {
            return Err(E::EvalSplitWithEvalData);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options of a command line, with the flags it gives (as `train`
    /// reads them).
    fn parse(args: &[&str]) -> TrainOptions {
        use clap::{CommandFactory, FromArgMatches};
        #[derive(clap::Parser)]
        struct Args {
            #[command(flatten)]
            opts: TrainOptions,
        }
        let args = std::iter::once("train").chain(args.iter().copied());
        let matches = Args::command().try_get_matches_from(args).unwrap();
        TrainOptions {
            given: GivenFlags::of(&matches),
            ..Args::from_arg_matches(&matches).unwrap().opts
        }
    }

    /// A flag that the rest would make ignored is refused when given, even
    /// at its default, and not when left out; an engine option is refused
    /// with --resident when given or when its value asks for the engine.
    #[test]
    fn ignored_flags_are_refused_when_given_or_set() {
        let refused = |args: &[&str]| validate(&parse(args)).unwrap_err().to_string();
        assert_eq!(refused(&["--keep", "3"]), "--keep needs --checkpoint-dir");
        validate(&parse(&["--keep", "3", "--checkpoint-dir", "ck"])).unwrap();
        let engine = "is an option of the offload engine; drop it or --resident";
        for (args, flag) in [
            (
                &["--resident", "--optim-state", "fp32"][..],
                "--optim-state",
            ),
            (&["--resident", "--max-skips", "5"], "--max-skips"),
            (&["--resident", "--fused"], "--fused"),
        ] {
            assert_eq!(refused(args), format!("{flag} {engine}"));
        }
        validate(&parse(&["--resident"])).unwrap();
        validate(&parse(&["--resident", "--gpus", "1"])).unwrap();
        let set = TrainOptions {
            resident: true,
            optim_state: OptimState::EightBit,
            ..TrainOptions::default()
        };
        assert_eq!(
            validate(&set).unwrap_err().to_string(),
            format!("--optim-state {engine}")
        );
    }

    /// `--adam-betas` and `--adam-eps` reach the optimizers; burn-optim's
    /// defaults otherwise; rates outside [0, 1), a third rate or a
    /// non-positive epsilon are refused.
    #[test]
    fn adam_settings_reach_the_optimizers_and_are_checked() {
        let default = parse(&[]).adamw();
        assert_eq!(
            (default.beta_1, default.beta_2, default.epsilon),
            (0.9, 0.999, 1e-5)
        );
        let opts = parse(&["--adam-betas", "0.9,0.95", "--adam-eps", "1e-8"]);
        let adamw = opts.adamw();
        assert_eq!(
            (adamw.beta_1, adamw.beta_2, adamw.epsilon),
            (0.9, 0.95, 1e-8)
        );
        validate(&opts).unwrap();
        for bad in [
            &["--adam-betas", "0.9,1.0"][..],
            &["--adam-betas", "0.9,0.95,0.99"],
            &["--adam-betas", "0.9"],
            &["--adam-eps", "0"],
        ] {
            let err = validate(&parse(bad)).unwrap_err().to_string();
            assert!(err.starts_with(bad[0]), "{bad:?}: {err}");
        }
    }
}
