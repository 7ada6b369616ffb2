//! Where a run writes: the checkpoint folder and the `--metrics` file, each
//! checked (the folder locked) before the first step, so a bad path costs no
//! training (the `--export-hf` folder: [`crate::export`]).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use burn_offload::checkpoint::{CheckpointDir, CheckpointError};
use serde::Serialize;

/// Why the checkpoint folder or the `--metrics` file could not be used,
/// naming the flag. (A checkpoint's or the OS's error is part of the
/// message rather than its source, so that error-chain printers do not
/// repeat it.)
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(
        "--checkpoint-dir: {error}; continue that run with `--resume {}`, or start over in an \
         empty folder (another --checkpoint-dir, or move its step-* folders away)",
        dir.display()
    )]
    OtherRun {
        dir: PathBuf,
        error: CheckpointError,
    },
    #[error("--checkpoint-dir: {0}; wait for it to end or choose another folder")]
    Locked(CheckpointError),
    #[error("--checkpoint-dir: {0}")]
    CheckpointDir(CheckpointError),
    #[error("--metrics `{}`: cannot open: {error}", path.display())]
    MetricsOpen {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("--metrics `{}`: cannot write: {error}", path.display())]
    MetricsWrite {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The resolved options (`config.toml`) beside the checkpoints.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A metrics line that does not serialise: serde's own words.
    #[error(transparent)]
    MetricsLine(#[from] serde_json::Error),
}

/// Opens `dir` for the checkpoints of `run`: creates and locks it, and
/// refuses it when another run's checkpoints are there.
pub fn checkpoint_dir(dir: &Path, run: &str, keep: usize) -> Result<CheckpointDir, OutputError> {
    CheckpointDir::open(dir, run, keep).map_err(|error| match error {
        CheckpointError::OtherRun { .. } => OutputError::OtherRun {
            dir: dir.to_path_buf(),
            error,
        },
        CheckpointError::Locked { .. } => OutputError::Locked(error),
        error => OutputError::CheckpointDir(error),
    })
}

/// The `--metrics` file: one JSON object per line, each written with a single
/// `write` when its step ends, so the file can be followed live and keeps
/// every finished step's line if the process is killed.
pub struct MetricsFile {
    path: PathBuf,
    file: File,
}

impl MetricsFile {
    /// Opens `path`, truncating it for a new run or appending to it when the
    /// run continues from a checkpoint.
    pub fn open(path: &Path, append: bool) -> Result<Self, OutputError> {
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(|error| OutputError::MetricsOpen {
                path: path.to_path_buf(),
                error,
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends `value` as one line.
    pub fn line(&mut self, value: &impl Serialize) -> Result<(), OutputError> {
        let mut line = serde_json::to_vec(value)?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .map_err(|error| OutputError::MetricsWrite {
                path: self.path.clone(),
                error,
            })
    }
}

/// The line a resume writes into the metrics file before its first step.
#[derive(Debug, Serialize)]
pub struct ResumeMarker<'a> {
    /// The checkpoint the run continues from.
    pub resumed_from: &'a Path,
    /// Steps it holds: the next line is this step's.
    pub step: usize,
}
