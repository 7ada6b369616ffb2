//! Developer commands: `cargo xtask <command>` (alias in `.cargo/config.toml`).
//!
//! - `cargo xtask ci`: what CI runs (`.ci/run`).
//! - `cargo xtask bench optim`: CPU AdamW throughput of burn-offload's fused
//!   rayon loop against burn-optim's AdamW on the CPU backend and a
//!   single-threaded scalar loop, side by side in one process.
//! - `cargo xtask bench cuda run`: the GPU comparison against resident burn
//!   and PyTorch on this machine's GPU, built, run and reported in one go.
//! - `cargo xtask bench cuda build|report`: the same comparison on a remote
//!   GPU machine without a Rust toolchain, in two halves around
//!   `bench/gpu/pipeline.sh` (see `bench_cuda`).

mod bench_cuda;
mod bench_optim;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "burn-offload developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run what CI runs (.ci/run).
    Ci,
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// CPU AdamW throughput (Gparam/s): ours vs burn-optim vs a scalar loop.
    Optim(bench_optim::Args),
    /// GPU training throughput: burn-offload vs resident burn and PyTorch.
    Cuda {
        #[command(subcommand)]
        command: bench_cuda::Command,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Ci => {
            let status = std::process::Command::new("bash").arg(".ci/run").status()?;
            if !status.success() {
                bail!(".ci/run failed ({status})");
            }
            Ok(())
        }
        Command::Bench {
            which: Bench::Optim(args),
        } => bench_optim::run(args),
        Command::Bench {
            which: Bench::Cuda { command },
        } => bench_cuda::run(command),
    }
}
