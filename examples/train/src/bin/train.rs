//! `train`: trains a GPT-2 or Llama decoder on a text corpus.
//!
//! With no arguments it trains the `tiny` GPT-2 on the built-in corpus on the
//! CPU and prints a sample of generated text at the end.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use trainer::config::{self, ConfigError, FileArgs};
use trainer::error_line::print_error;
use trainer::options::{validate, GivenFlags, TrainOptions};
use trainer::plot::{beside, plot_files};
use trainer::processes::{PlaceSource, RankOptions};
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
    #[command(flatten)]
    opts: TrainOptions,
    /// Engine: start N processes of this program on this host that train
    /// as one run, one GPU each (rank r on GPU r), each with its own host
    /// store and its own --accum micro-batches of --batch sequences per
    /// step; gradients are summed with NCCL (on the CPU build, through the
    /// rendezvous links). Every other flag goes to each process; rank 0
    /// writes checkpoints, metrics, the export and the sample.
    #[arg(long, conflicts_with_all = ["rank", "world_size"])]
    processes: Option<usize>,
    /// This process's rank in a run of --world-size processes started by
    /// hand (one per GPU, on one host or several; see --processes). With
    /// no rank flag, a launcher's environment places the process: torchrun's
    /// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    /// MASTER_PORT, or srun's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, tasks
    /// per node, and MASTER_ADDR (else the job's first node) and MASTER_PORT
    /// (else 29500).
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
    /// Read options from this TOML file, whose keys are the long names of
    /// the flags above (`seq-len = 4096`, `fused = true`); a flag given
    /// here overrides its key. (`--resume` reads the `config.toml` a run
    /// writes beside its checkpoints the same way, under both.)
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the predicted host and GPU memory of the job against the
    /// machine's, then exit without allocating anything.
    #[arg(long)]
    plan: bool,
}

impl Cli {
    /// This process's place in a run of several: rank 0 of the launcher's
    /// `--processes` (one process's share of the host, the plan and the
    /// checks each rank makes), or the `--rank` given.
    fn place(&self) -> Option<RankOptions> {
        match (self.processes, self.rank, self.world_size) {
            (Some(n), _, _) => Some(RankOptions {
                rank: 0,
                world_size: n,
                rendezvous: self.rendezvous.clone(),
                local_rank: 0,
                local_world_size: n,
                source: PlaceSource::Flags,
            }),
            (None, Some(rank), Some(world_size)) => Some(RankOptions {
                rank,
                world_size,
                rendezvous: self.rendezvous.clone(),
                local_rank: self.local_rank.unwrap_or(rank),
                local_world_size: self.local_world_size.unwrap_or(world_size),
                source: PlaceSource::Flags,
            }),
            _ => None,
        }
    }
}

/// The ids of `train`'s flags that place a process in a run of several:
/// when none is given, a launcher's environment (torchrun's, srun's) may.
const RANK_FLAGS: [&str; 6] = [
    "processes",
    "rank",
    "world_size",
    "rendezvous",
    "local_rank",
    "local_world_size",
];

/// `--plan`: the predicted memory table, printed, or the one-line error.
fn print_plan(opts: &TrainOptions) -> ExitCode {
    match trainer::run::plan_table(opts) {
        Ok(table) => {
            print!("{table}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            print_error("", &err);
            ExitCode::FAILURE
        }
    }
}

/// The options of `args` (the command line) over those of its `--config`
/// file over those of the `config.toml` beside its `--resume` checkpoint,
/// each layer's keys as flags before the next's (a later flag overrides an
/// earlier one), and the flags given: the command line's and the file's.
fn layered(args: &[OsString]) -> Result<(ArgMatches, GivenFlags), ConfigError> {
    let command_line = Cli::command().get_matches_from(args);
    let file = match command_line.get_one::<PathBuf>("config") {
        Some(path) => config::read("--config", path)?,
        None => FileArgs::default(),
    };
    let command_given = GivenFlags::of(&command_line);
    // The file's keys over the saved ones: both given, as typed flags are.
    let given = command_given.clone().with(file.ids());
    let layers = |saved: &FileArgs| -> Vec<OsString> {
        let (program, flags) = args.split_first().expect("the program's name");
        let mut all = vec![program.clone()];
        all.extend(saved.args_but(&given));
        all.extend(file.args_but(&command_given));
        all.extend(flags.iter().cloned());
        all
    };
    let mut matches = Cli::command().get_matches_from(layers(&FileArgs::default()));
    let saved = matches
        .get_one::<PathBuf>("resume")
        .and_then(|resume| config::saved_beside(resume));
    if let Some(path) = saved {
        let saved = config::read("--resume", &path)?;
        matches = Cli::command().get_matches_from(layers(&saved));
    }
    Ok((matches, given))
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let (matches, given) = match layered(&args) {
        Ok(layered) => layered,
        Err(err) => {
            print_error("", &err);
            return ExitCode::FAILURE;
        }
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    // Flags win over a launcher's environment, which is read only when no
    // rank flag is given.
    let place = match cli.place() {
        Some(place) => Some(place),
        None if RANK_FLAGS.iter().any(|id| given.contains(id)) => None,
        None => {
            let lookup =
                |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
            match trainer::launcher_env::place_from(lookup) {
                Ok(place) => place,
                Err(err) => {
                    print_error("", &err);
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    // Of several processes, the rank started by hand or by a launcher.
    let rank = place
        .as_ref()
        .filter(|_| cli.processes.is_none())
        .map(|p| p.rank);
    let opts = TrainOptions {
        // Of several processes, rank 0 reports.
        progress: rank.is_none_or(|rank| rank == 0),
        processes: place,
        given,
        resolved_config: Some(config::resolved(&matches)),
        ..cli.opts.clone()
    };
    // Every flag's rules, before anything else is looked at.
    if let Err(err) = validate(&opts) {
        print_error("", &err);
        return ExitCode::FAILURE;
    }
    #[cfg(feature = "cuda")]
    if let Err(err) = trainer::preflight::cuda_driver() {
        print_error("", &err);
        return ExitCode::FAILURE;
    }
    if let Some(n) = cli.processes {
        if cli.plan {
            return print_plan(&opts);
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
        return print_plan(&opts);
    }
    if let Err(err) = signals::install() {
        print_error("", &err);
        return ExitCode::FAILURE;
    }
    // Of several processes, rank 0 reports the run; the others only their errors.
    let quiet = rank.is_some_and(|rank| rank > 0);
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
            if let Some(dir) = &report.adapters {
                println!("adapters: {} (PEFT's adapter files)", dir.display());
            }
            if let Some(path) = &opts.metrics {
                println!("metrics: {}", path.display());
                // The curves beside the numbers; the run is done whatever
                // becomes of them.
                let png = beside(path);
                match plot_files(std::slice::from_ref(path), &png, None) {
                    Ok(()) => println!("plot: {}", png.display()),
                    Err(err) => eprintln!("warning: no plot of the metrics: {err}"),
                }
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
            if let Some((done, eval)) = report.evaluations.last() {
                println!(
                    "eval loss {:.4} (perplexity {:.2}) after step {done}",
                    eval.loss,
                    eval.loss.exp()
                );
            }
            if let Some(best) = report.best_eval {
                println!(
                    "best eval loss {:.4} after step {}{}",
                    best.loss,
                    best.steps_done,
                    match &opts.checkpoint_dir {
                        Some(dir) if opts.keep_best => format!(" (kept in {})", dir.display()),
                        _ => String::new(),
                    }
                );
            }
            if opts.sample_tokens > 0 {
                println!("--- sample ---\n{}", report.sample);
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            match rank {
                Some(rank) => print_error(&format!("rank {rank}: "), &err),
                None => print_error("", &err),
            }
            ExitCode::FAILURE
        }
    }
}
