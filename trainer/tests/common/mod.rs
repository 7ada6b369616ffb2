//! Running the `train` binary from the integration tests.

// Each test file includes this module and uses part of it.
#![allow(dead_code)]

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
