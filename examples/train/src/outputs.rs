//! Where a run writes: the checkpoint folder and the `--metrics` file, each
//! checked (the folder locked) before the first step, so a bad path costs no
//! training (the `--export-hf` folder: [`crate::export`]).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use burn_offload::checkpoint::{CheckpointDir, CheckpointError};
use serde::Serialize;

/// Opens `dir` for the checkpoints of `run`: creates and locks it, and
/// refuses it when another run's checkpoints are there.
pub fn checkpoint_dir(dir: &Path, run: &str, keep: usize) -> Result<CheckpointDir> {
    CheckpointDir::open(dir, run, keep).map_err(|err| match err {
        CheckpointError::OtherRun { .. } => anyhow!(
            "--checkpoint-dir: {err}; continue that run with `--resume {}`, or start over \
             in an empty folder (another --checkpoint-dir, or move its step-* folders away)",
            dir.display()
        ),
        CheckpointError::Locked { .. } => {
            anyhow!("--checkpoint-dir: {err}; wait for it to end or choose another folder")
        }
        err => anyhow!("--checkpoint-dir: {err}"),
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
    pub fn open(path: &Path, append: bool) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(|err| anyhow!("--metrics `{}`: cannot open: {err}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends `value` as one line.
    pub fn line(&mut self, value: &impl Serialize) -> Result<()> {
        let mut line = serde_json::to_vec(value)?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .map_err(|err| anyhow!("--metrics `{}`: cannot write: {err}", self.path.display()))
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
