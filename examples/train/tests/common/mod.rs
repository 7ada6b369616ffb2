//! Running the `train` binary from the integration tests.

// Each test file includes this module and uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// A tiny, fast run: one sequence of 8 tokens a step, one sampled token.
pub const FAST: [&str; 6] = ["--batch", "1", "--seq-len", "8", "--sample-tokens", "1"];

/// A short fine-tune: two steps of two 32-token windows, one sampled token.
pub const FINETUNE: [&str; 8] = [
    "--steps",
    "2",
    "--batch",
    "2",
    "--seq-len",
    "32",
    "--sample-tokens",
    "1",
];

/// The variables of the launchers `train` reads (torchrun's, srun's),
/// removed from the processes the tests start: a test run under
/// `srun` still runs each `train` alone, and a test sets its own.
pub const LAUNCHER_VARIABLES: [&str; 15] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
];

/// Runs `train` with `base`, then `args` (a later flag overrides an earlier one).
pub fn train(base: &[&str], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_train"));
    for name in LAUNCHER_VARIABLES {
        command.env_remove(name);
    }
    command
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

/// The fixtures folder of the workspace.
pub fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// A Llama 3-style checkpoint folder in `dir`: the llama3 family fixture
/// (vocabulary 3000, with its `generation_config.json`) with the fixture
/// tokenizer (662 tokens, Llama 3's chat template).
pub fn llama3_checkpoint(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("llama3-chat");
    std::fs::create_dir_all(&out).unwrap();
    for file in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(
            fixtures().join("families/llama3").join(file),
            out.join(file),
        )
        .unwrap();
    }
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixtures().join("tokenizer").join(file), out.join(file)).unwrap();
    }
    out
}

/// The `error:` lines of a run's stderr.
pub fn error_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("error:"))
        .map(str::to_owned)
        .collect()
}

/// The JSON lines of a metrics file (none when it does not exist).
pub fn metrics(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
