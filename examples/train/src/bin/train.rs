//! `train`: trains a GPT-2 or Llama decoder on a text corpus.
//!
//! With no arguments it trains the `tiny` GPT-2 on the built-in corpus on the
//! CPU and prints a sample of generated text at the end.

use std::path::PathBuf;
use std::process::ExitCode;

use burn_offload::Compute;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use trainer::error_line::print_error;
use trainer::options::{AttentionKernels, TrainOptions};
use trainer::processes::RankOptions;
use trainer::run::run;
use trainer::signals;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Train a GPT-2 or Llama decoder (burn-offload)",
    args_override_self = true,
    // `--lr -1` is a value (refused by the checks as not positive), not an
    // unknown flag `-1`.
    allow_negative_numbers = true
)]
struct Cli {
    /// Model preset (tiny, gpt2-tiny, llama-tiny, gpt2-124m, gpt2-xl, llama-1b,
    /// llama-3b, llama-7b, llama-8b) or a path to a config .json.
    #[arg(long, default_value = "tiny")]
    model: String,
    /// Optimizer steps.
    #[arg(long, default_value_t = trainer::options::DEFAULT_STEPS)]
    steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 64)]
    seq_len: usize,
    /// Peak learning rate (after warm-up; cosine decay afterwards).
    /// Default: 1e-2 from scratch (the built-in tiny model's), 2e-5 with
    /// --init-from (fine-tuning a pretrained model).
    #[arg(long)]
    lr: Option<f64>,
    /// Warm-up steps.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Final learning rate as a fraction of the peak.
    #[arg(long, default_value_t = 0.1)]
    min_lr_ratio: f64,
    /// AdamW decoupled weight decay.
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,
    /// Gradient-norm clip, 0 disables (global norm in the engine; per tensor with --resident).
    #[arg(long, default_value_t = 1.0)]
    grad_clip: f64,
    /// Seed for initialisation, batches and sampling.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Text file, .jsonl file (field `text`) or directory of them, or
    /// instruction data (see --data-format); the built-in corpus when omitted.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Tokenizer: `byte`, `gpt2` (BPE), or a Hugging Face tokenizer.json
    /// (the file or its folder). Default: the tokenizer.json of --init-from
    /// when it has one, else `byte`.
    #[arg(long)]
    tokenizer: Option<String>,
    /// What --data holds: `auto` (decided from the files), `text`, or the
    /// instruction formats `alpaca`, `sharegpt`, `chat` (JSON Lines or a
    /// JSON array), rendered with the tokenizer's chat template.
    #[arg(long, default_value = "auto")]
    data_format: trainer::instruct::DataFormat,
    /// Where tokenized text corpora are cached (keyed by the data files and
    /// the tokenizer; reused by later runs and resumes). Default:
    /// $XDG_CACHE_HOME/burn-offload/tokens or ~/.cache/burn-offload/tokens.
    #[arg(long)]
    data_cache: Option<PathBuf>,
    /// Instruction data: train on the prompt's tokens too (by default the
    /// loss covers the assistant's tokens only).
    #[arg(long)]
    train_on_prompt: bool,
    /// Instruction data: one example per window, padded, instead of packing
    /// several into each (packed examples keep their boundaries: none
    /// attends to another, positions restart at each).
    #[arg(long)]
    no_packing: bool,
    /// Write per-step metrics as JSON lines to this file.
    #[arg(long)]
    metrics: Option<PathBuf>,
    /// Tokens to generate after training.
    #[arg(long, default_value_t = 200)]
    sample_tokens: usize,
    /// Sampling temperature (0 = greedy, which repeats itself on small
    /// models).
    #[arg(long, default_value_t = trainer::options::DEFAULT_TEMPERATURE)]
    temperature: f64,
    /// Train with plain burn (whole model under Autodiff, burn-optim AdamW with
    /// per-tensor clipping) instead of the block-streamed offload engine.
    #[arg(long)]
    resident: bool,
    /// With --resident: the model on burn-offload's `Offload<B>` backend (the
    /// type parameter: parameters in host memory, paged in as operations
    /// read them) and the host AdamW (optimizer state in host memory).
    #[arg(long)]
    host_params: bool,
    /// With --host-params: GPU memory for device copies of the host-resident
    /// parameters, in GiB, kept between the forward and the backward of a
    /// step (and the page-ins ahead of use). Default: every parameter's,
    /// when the plan fits the GPU with them, else 1 GiB.
    #[arg(long)]
    param_cache_gib: Option<f64>,
    /// Engine: apply each block's AdamW update as soon as its gradient arrives
    /// (12 host bytes/param instead of 16; no --accum). The gradient norm is
    /// needed before the first update (non-finite guard, clipping), so the
    /// backward runs twice per step.
    #[arg(long)]
    fused: bool,
    /// Engine: switch the overlap off, the serialised baseline for benchmarks:
    /// each block's weight copy lands before it computes, and the CPU works on
    /// a block's gradients only while the GPU is idle.
    #[arg(long)]
    serial_copies: bool,
    /// Engine on CUDA: let threads that wait for the device spin on a core
    /// (the driver's default) instead of sleeping; a benchmark baseline.
    #[arg(long)]
    spin_waits: bool,
    /// Engine: let the host optimizer run while the forward's weight copies
    /// are in flight (sharing host memory bandwidth with them) instead of
    /// waiting for each to land; a benchmark baseline.
    #[arg(long)]
    updates_during_copies: bool,
    /// Engine: update without first checking the gradients for non-finite
    /// values. With --fused and --grad-clip 0 the backward then runs once per
    /// step instead of twice; a non-finite loss stops the run after the fact.
    #[arg(long)]
    no_guard: bool,
    /// Micro-batches of --batch sequences accumulated per step (with --resident
    /// too: one micro-batch's graph at a time, gradients summed on the device).
    #[arg(long, default_value_t = 1)]
    accum: usize,
    /// Devices to train on, data parallel (offload engine only): GPUs
    /// 0..N, each running its own --accum micro-batches of --batch sequences
    /// per step, their gradients summed with NCCL; on the CPU build, N
    /// logical devices on the one CPU.
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    /// Engine: start N processes of this program on this host that train
    /// as one run, one GPU each (rank r on GPU r), each with its own host
    /// store and its own --accum micro-batches of --batch sequences per
    /// step; gradients are summed with NCCL (on the CPU build, through the
    /// rendezvous links). Every other flag goes to each process; rank 0
    /// writes checkpoints, metrics, the export and the sample.
    #[arg(long, conflicts_with_all = ["rank", "world_size"])]
    processes: Option<usize>,
    /// This process's rank in a run of --world-size processes started by
    /// hand (one per GPU, on one host or several; see --processes).
    #[arg(long, requires = "world_size")]
    rank: Option<usize>,
    /// Processes in the run, on every host (with --rank).
    #[arg(long, requires = "rank")]
    world_size: Option<usize>,
    /// With --rank: `host:port` where rank 0 listens and the others connect.
    #[arg(long, default_value = "127.0.0.1:29500")]
    rendezvous: String,
    /// With --rank: this process's GPU on its host (default: --rank).
    #[arg(long)]
    local_rank: Option<usize>,
    /// With --rank: processes on this host, which share its memory
    /// (default: --world-size, all on one host).
    #[arg(long)]
    local_world_size: Option<usize>,
    /// Precision the device computes in: fp32, or bf16 (weights, activations
    /// and gradients on the device; master weights, Adam state and gradient
    /// accumulation stay f32 on the host; the loss is taken in f32). With
    /// --resident, bf16 casts the f32 parameters for each forward (autocast-like).
    #[arg(long, default_value = "fp32")]
    compute: Compute,
    /// The matmul kernel on CUDA: `fast` (the default of CUDA builds: cuBLAS
    /// when libcublas is on LD_LIBRARY_PATH, f32 in TF32 math as burn's own
    /// f32 matmul computes it; else cubek's fastest strategies), `auto` (burn's own choice), `cublas` (f32 in full
    /// f32), `cublas-tf32` (f32 in TF32, as cubek computes it), or one of
    /// cubek's strategies by name, e.g. `matmul_specialized_tma_mma` (a case
    /// the kernel cannot run falls back to burn's). An unknown name lists the others.
    #[arg(long, default_value = burn_offload::DEFAULT_MATMUL)]
    matmul: String,
    /// Attention on CUDA in bf16/f16: `auto` (cuDNN's fused attention where
    /// libcudnn.so.9 is on LD_LIBRARY_PATH, as a CUDA install or the
    /// nvidia-cudnn wheel puts it; else the crate's CubeCL kernels) or
    /// `cubecl` (the crate's kernels). The run says once which ran.
    #[arg(long, value_enum, default_value = "auto")]
    attention: AttentionKernels,
    /// Engine: tokens per chunk of the LM head and loss.
    #[arg(long, default_value_t = 4096)]
    loss_chunk_tokens: usize,
    /// Engine on a GPU: where the block inputs it recomputes from are kept.
    /// `device` saves a copy each way per block and step; `host` keeps GPU
    /// memory flat in depth; `auto` takes `device` when the memory plan
    /// still fits the GPU with them there (`--plan` shows the choice).
    #[arg(long, default_value = "auto")]
    block_inputs: trainer::plan::BlockInputs,
    /// Engine below fp32 compute: how the host holds the weights for upload
    /// and the gradients. `full`: bf16 weights and an fp32 gradient buffer
    /// (18 B/param; fused 14); `compact`: the fp32 weights cast on the GPU
    /// and, with one micro-batch, the blocks' gradients kept in bf16 as they
    /// arrive (14 B/param; fused 12). Neither changes what clipping sees.
    /// `auto`: compact when full does not fit the host (`--plan` shows it).
    #[arg(long, default_value = "auto")]
    host_layout: trainer::plan::HostLayout,
    /// Engine: the optimizer's moments in host memory. `fp32`: 8 B/param;
    /// `8bit`: blockwise 8-bit (bitsandbytes' 8-bit Adam scheme: a byte per
    /// value, a scale per 256, a non-linear code), about 2 B/param,
    /// dequantised and quantised again in the update loop.
    #[arg(long, default_value = "fp32")]
    optim_state: trainer::plan::OptimState,
    /// Engine: how many of the last blocks run their forward under autodiff
    /// and keep the graph on the device until the backward, which then skips
    /// their recompute. `auto`: on a GPU, as many as the memory plan fits in
    /// 90% of the free memory it leaves (`--plan` shows the count); 0 on CPU.
    #[arg(long, default_value = "auto")]
    keep_graphs: trainer::plan::KeptGraphs,
    /// Write checkpoints (safetensors + manifest) into this folder: every
    /// --checkpoint-every steps, at the end, and on Ctrl-C.
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end and on Ctrl-C/SIGTERM).
    #[arg(long, default_value_t = 0)]
    checkpoint_every: usize,
    /// This run's checkpoints to keep in --checkpoint-dir (the oldest written
    /// are removed; other runs' checkpoints are never touched).
    #[arg(long, default_value_t = 3)]
    keep: usize,
    /// Continue from a checkpoint folder (or the newest one inside a folder).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Stop after this many consecutive steps with a non-finite loss or gradient.
    #[arg(long, default_value_t = 5)]
    max_skips: usize,
    /// Fine-tune from a Hugging Face checkpoint folder (config.json +
    /// model.safetensors or shards); its config replaces --model.
    #[arg(long)]
    init_from: Option<PathBuf>,
    /// After training, write the model as a Hugging Face checkpoint folder
    /// (config.json with the special tokens' ids, generation_config.json,
    /// model.safetensors and the tokenizer's files). A folder that holds
    /// files, or is (or is inside) --init-from, --resume or
    /// --checkpoint-dir, is refused before the first step.
    #[arg(long)]
    export_hf: Option<PathBuf>,
    /// Let --export-hf replace a folder that holds files or that the run
    /// starts from (the new folder takes its place once it is complete).
    #[arg(long)]
    overwrite: bool,
    /// Stop after this many steps (checkpointing if --checkpoint-dir is set),
    /// keeping --steps as the length of the learning-rate schedule.
    #[arg(long)]
    stop_after: Option<usize>,
    /// Host memory the run may use, in GiB (default: MemAvailable).
    #[arg(long)]
    host_mem_gib: Option<f64>,
    /// GPU memory the run may use, in GiB (default: free memory on GPU 0).
    #[arg(long)]
    gpu_mem_gib: Option<f64>,
    /// Print the predicted host and GPU memory of the job against the
    /// machine's, then exit without allocating anything.
    #[arg(long)]
    plan: bool,
}

/// Flags that the rest of the command line would make ignored: each is
/// refused rather than silently dropped. (Flags without defaults are checked
/// in `TrainOptions`' validation.)
fn refuse_ignored_flags(matches: &ArgMatches, cli: &Cli) -> Result<(), String> {
    let given = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    let rules: [(&str, &str, bool, &str); 14] = [
        (
            "processes",
            "--processes",
            cli.resident,
            "is an option of the offload engine; drop it or --resident",
        ),
        (
            "processes",
            "--processes",
            cli.gpus > 1,
            "starts one process per GPU; drop --gpus",
        ),
        (
            "rendezvous",
            "--rendezvous",
            cli.world_size.is_none(),
            "needs --rank and --world-size (--processes picks its own)",
        ),
        (
            "local_rank",
            "--local-rank",
            cli.world_size.is_none(),
            "needs --rank and --world-size",
        ),
        (
            "local_world_size",
            "--local-world-size",
            cli.world_size.is_none(),
            "needs --rank and --world-size",
        ),
        (
            "keep",
            "--keep",
            cli.checkpoint_dir.is_none(),
            "needs --checkpoint-dir",
        ),
        (
            "checkpoint_every",
            "--checkpoint-every",
            cli.checkpoint_dir.is_none(),
            "needs --checkpoint-dir",
        ),
        (
            "temperature",
            "--temperature",
            cli.sample_tokens == 0,
            "has no effect with --sample-tokens 0",
        ),
        (
            "max_skips",
            "--max-skips",
            cli.resident,
            "is an option of the offload engine; drop it or --resident",
        ),
        (
            "loss_chunk_tokens",
            "--loss-chunk-tokens",
            cli.resident,
            "is an option of the offload engine; drop it or --resident",
        ),
        (
            "block_inputs",
            "--block-inputs",
            cli.resident,
            "is an option of the offload engine; drop it or --resident",
        ),
        (
            "keep_graphs",
            "--keep-graphs",
            cli.resident,
            "is an option of the offload engine; drop it or --resident",
        ),
        (
            "host_layout",
            "--host-layout",
            cli.resident,
            "is an option of the offload engine; drop it or --resident",
        ),
        (
            "optim_state",
            "--optim-state",
            cli.resident,
            "is an option of the offload engine; drop it or --resident",
        ),
    ];
    match rules
        .iter()
        .find(|(id, _, ignored, _)| *ignored && given(id))
    {
        Some((_, flag, _, why)) => Err(format!("{flag} {why}")),
        None => Ok(()),
    }
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    if let Err(why) = refuse_ignored_flags(&matches, &cli) {
        print_error("", &anyhow::anyhow!(why));
        return ExitCode::FAILURE;
    }
    let opts = TrainOptions {
        model: cli.model,
        steps: cli.steps,
        batch: cli.batch,
        seq_len: cli.seq_len,
        lr: cli.lr.unwrap_or(if cli.init_from.is_some() {
            trainer::options::DEFAULT_FINETUNE_LR
        } else {
            trainer::options::DEFAULT_LR
        }),
        warmup: cli.warmup,
        min_lr_ratio: cli.min_lr_ratio,
        weight_decay: cli.weight_decay,
        grad_clip: cli.grad_clip,
        seed: cli.seed,
        data: cli.data,
        tokenizer: cli.tokenizer,
        metrics: cli.metrics,
        sample_tokens: cli.sample_tokens,
        temperature: cli.temperature,
        // Of several processes, rank 0 reports.
        progress: cli.rank.is_none_or(|rank| rank == 0),
        resident: cli.resident,
        host_params: cli.host_params,
        param_cache_gib: cli.param_cache_gib,
        fused: cli.fused,
        serial_copies: cli.serial_copies,
        spin_waits: cli.spin_waits,
        updates_during_copies: cli.updates_during_copies,
        no_guard: cli.no_guard,
        accum: cli.accum,
        gpus: cli.gpus,
        processes: match (cli.rank, cli.world_size) {
            (Some(rank), Some(world_size)) => Some(RankOptions {
                rank,
                world_size,
                rendezvous: cli.rendezvous.clone(),
                local_rank: cli.local_rank.unwrap_or(rank),
                local_world_size: cli.local_world_size.unwrap_or(world_size),
            }),
            _ => None,
        },
        compute: cli.compute,
        matmul: cli.matmul,
        attention: cli.attention,
        loss_chunk_tokens: cli.loss_chunk_tokens,
        block_inputs: cli.block_inputs,
        host_layout: cli.host_layout,
        optim_state: cli.optim_state,
        kept_graphs: cli.keep_graphs,
        checkpoint_dir: cli.checkpoint_dir,
        checkpoint_every: cli.checkpoint_every,
        keep: cli.keep,
        resume: cli.resume,
        max_skips: cli.max_skips,
        host_mem_gib: cli.host_mem_gib,
        gpu_mem_gib: cli.gpu_mem_gib,
        init_from: cli.init_from,
        export_hf: cli.export_hf,
        overwrite: cli.overwrite,
        stop_after: cli.stop_after,
        data_format: cli.data_format,
        data_cache: cli.data_cache,
        train_on_prompt: cli.train_on_prompt,
        packing: !cli.no_packing,
        poison_at_step: None,
    };
    #[cfg(feature = "cuda")]
    if let Err(err) = trainer::preflight::cuda_driver() {
        print_error("", &anyhow::anyhow!(err));
        return ExitCode::FAILURE;
    }
    if let Some(n) = cli.processes {
        if n < 2 {
            print_error(
                "",
                &anyhow::anyhow!("--processes must be at least 2, got {n}"),
            );
            return ExitCode::FAILURE;
        }
        // Rank 0's options: one process's share of the host, the plan and
        // the checks each rank makes.
        let opts = TrainOptions {
            processes: Some(RankOptions {
                rank: 0,
                world_size: n,
                rendezvous: cli.rendezvous,
                local_rank: 0,
                local_world_size: n,
            }),
            ..opts
        };
        if cli.plan {
            return match trainer::run::plan_table(&opts) {
                Ok(table) => {
                    print!("{table}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    print_error("", &err);
                    ExitCode::FAILURE
                }
            };
        }
        // What every rank would refuse is refused once, before any starts.
        if let Err(err) = trainer::run::preflight(&opts) {
            print_error("", &err);
            return ExitCode::FAILURE;
        }
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        return match trainer::processes::launch(n, &args) {
            Ok(status) if status.success() => ExitCode::SUCCESS,
            Ok(status) => ExitCode::from(status.code().map_or(1, |c| c.clamp(1, 255) as u8)),
            Err(err) => {
                print_error("", &err);
                ExitCode::FAILURE
            }
        };
    }
    if cli.plan {
        return match trainer::run::plan_table(&opts) {
            Ok(table) => {
                print!("{table}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                print_error("", &err);
                ExitCode::FAILURE
            }
        };
    }
    if let Err(err) = signals::install() {
        print_error("", &err);
        return ExitCode::FAILURE;
    }
    // Of several processes, rank 0 reports the run; the others only their errors.
    let quiet = cli.rank.is_some_and(|rank| rank > 0);
    match run(&opts) {
        Ok(report) if quiet => ExitCode::from(report.interrupted.map_or(0, |s| 128 + s as u8)),
        Ok(report) if report.interrupted.is_some() => {
            let signal = report.interrupted.unwrap_or_default();
            let name = signals::name(signal);
            match (&report.checkpoint, &report.resumed_from) {
                (Some(path), _) => {
                    eprintln!(
                        "interrupted ({name}): checkpoint saved to {}",
                        path.display()
                    )
                }
                (None, _) if opts.checkpoint_dir.is_none() => {
                    eprintln!("interrupted ({name}): nothing saved (no --checkpoint-dir given)")
                }
                (None, Some(from)) if report.losses.is_empty() => eprintln!(
                    "interrupted ({name}) before the first step: `{}` still holds the run",
                    from.display()
                ),
                (None, _) => {
                    eprintln!("interrupted ({name}) before the first step: nothing to save")
                }
            }
            if opts.export_hf.is_some() {
                eprintln!("--export-hf not written: the run did not finish (resume it to finish)");
            }
            ExitCode::from(128 + signal as u8)
        }
        Ok(report) if report.losses.is_empty() && report.start_step == opts.steps => {
            let from = report
                .resumed_from
                .as_deref()
                .unwrap_or(std::path::Path::new("?"));
            println!(
                "nothing left to do: checkpoint `{}` is at step {} of --steps {} (raise --steps to train further)",
                from.display(),
                report.start_step,
                opts.steps
            );
            if let Some(dir) = &report.exported {
                println!("export: {} (a Hugging Face folder)", dir.display());
            }
            ExitCode::SUCCESS
        }
        Ok(report) => {
            if let Some(path) = &report.checkpoint {
                println!("checkpoint: {}", path.display());
            }
            if let Some(dir) = &report.exported {
                println!("export: {} (a Hugging Face folder)", dir.display());
            }
            if let Some(path) = &opts.metrics {
                println!("metrics: {}", path.display());
            }
            if report.skipped_total > 0 {
                println!(
                    "skipped {} steps with a non-finite loss or gradient",
                    report.skipped_total
                );
            }
            let first = report.losses.first().copied().unwrap_or(f32::NAN);
            let last = report.losses.last().copied().unwrap_or(f32::NAN);
            println!(
                "loss {first:.4} -> {last:.4} over {} steps",
                report.losses.len()
            );
            if opts.sample_tokens > 0 {
                println!("--- sample ---\n{}", report.sample);
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            match cli.rank {
                Some(rank) => print_error(&format!("rank {rank}: "), &err),
                None => print_error("", &err),
            }
            ExitCode::FAILURE
        }
    }
}
