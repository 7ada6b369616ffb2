//! Running the `train` binary from the integration tests.

// Each test file includes this module and uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// A tiny, fast run: one sequence of 8 tokens a step, one sampled token.
pub const FAST: [&str; 6] = ["--batch", "1", "--seq-len", "8", "--sample-tokens", "1"];

/// Runs `train` with `base`, then `args` (a later flag overrides an earlier one).
pub fn train(base: &[&str], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_train"))
        .args(base)
        .args(args)
        .output()
        .expect("train binary runs")
}

/// The checkpoints (`step-…` folders) in `dir`, sorted.
pub fn checkpoint_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    names.sort();
    names
}
