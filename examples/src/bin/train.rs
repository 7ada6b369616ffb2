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
    /// Gradient-norm clip, 0 disables (global norm in the engine; per tensor with --resident).
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
    /// Train with plain burn (whole model under Autodiff, burn-optim AdamW with
    /// per-tensor clipping) instead of the block-streamed offload engine.
    #[arg(long)]
    resident: bool,
    /// Engine: apply each block's AdamW update as soon as its gradient arrives
    /// (12 host bytes/param instead of 16; no --accum).
    #[arg(long)]
    fused: bool,
    /// Engine: micro-batches of --batch sequences accumulated per step.
    #[arg(long, default_value_t = 1)]
    accum: usize,
    /// Engine: tokens per chunk of the LM head and loss.
    #[arg(long, default_value_t = 4096)]
    loss_chunk_tokens: usize,
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
        resident: cli.resident,
        fused: cli.fused,
        accum: cli.accum,
        loss_chunk_tokens: cli.loss_chunk_tokens,
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
