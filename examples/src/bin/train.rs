//! `train`: trains a GPT-2 or Llama decoder on a text corpus.
//!
//! With no arguments it trains the `tiny` GPT-2 on the built-in corpus on the
//! CPU and prints a sample of generated text at the end.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use examples::train::{run, TrainOptions};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Train a GPT-2 or Llama decoder (burn-offload)",
    args_override_self = true
)]
struct Cli {
    /// Model preset (tiny, gpt2-tiny, llama-tiny, gpt2-124m, gpt2-xl, llama-1b,
    /// llama-3b, llama-7b, llama-8b) or a path to a config .json.
    #[arg(long, default_value = "tiny")]
    model: String,
    /// Optimizer steps.
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 64)]
    seq_len: usize,
    /// Peak learning rate (after warm-up; cosine decay afterwards).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Warm-up steps.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Final learning rate as a fraction of the peak.
    #[arg(long, default_value_t = 0.1)]
    min_lr_ratio: f64,
    /// AdamW decoupled weight decay.
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,
    /// Global gradient-norm clip (0 disables).
    #[arg(long, default_value_t = 1.0)]
    grad_clip: f64,
    /// Seed for initialisation, batches and sampling.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Text file, .jsonl file (field `text`) or directory of them; the built-in
    /// corpus when omitted.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Tokenizer: `byte` or `gpt2` (BPE).
    #[arg(long, default_value = "byte")]
    tokenizer: String,
    /// Write per-step metrics as JSON lines to this file.
    #[arg(long)]
    metrics: Option<PathBuf>,
    /// Tokens to generate after training.
    #[arg(long, default_value_t = 200)]
    sample_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let opts = TrainOptions {
        model: cli.model,
        steps: cli.steps,
        batch: cli.batch,
        seq_len: cli.seq_len,
        lr: cli.lr,
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
        progress: true,
    };
    match run(&opts) {
        Ok(report) => {
            let first = report.losses.first().copied().unwrap_or(f32::NAN);
            let last = report.losses.last().copied().unwrap_or(f32::NAN);
            println!(
                "loss {first:.4} -> {last:.4} over {} steps",
                report.losses.len()
            );
            println!("--- sample ---\n{}", report.sample);
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
