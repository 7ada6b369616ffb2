//! Continuing a run from its checkpoint: the state read back and checked
//! against this run's data and options.

use std::path::{Path, PathBuf};

use burn_offload::checkpoint::CheckpointError;
use models::ModelConfig;

use super::machine::*;
use super::state::*;
use crate::options::*;
use crate::tokenizer::Tokenizer;

/// Why `--resume`'s checkpoint cannot continue this run; each names the
/// checkpoint and what differs.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// Not found or not readable: the checkpoint's own words.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("checkpoint `{}` has no readable trainer state: {error}", path.display())]
    State {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("checkpoint `{}` is for model {theirs}, but --model gives {ours}", path.display())]
    Model {
        path: PathBuf,
        theirs: String,
        ours: String,
    },
    #[error("checkpoint `{}` was trained with tokenizer `{theirs}`, not `{ours}`", path.display())]
    Tokenizer {
        path: PathBuf,
        theirs: String,
        ours: String,
    },
    #[error(
        "checkpoint `{}` was trained on other data ({tokens} tokens); resume with the same \
         --data and --tokenizer",
        path.display()
    )]
    Data { path: PathBuf, tokens: usize },
    #[error(
        "checkpoint `{}` used --batch/--seq-len/--accum/--gpus/--world-size {theirs:?}, not \
         {ours:?}",
        path.display()
    )]
    Shape {
        path: PathBuf,
        theirs: RunShape,
        ours: RunShape,
    },
    #[error(
        "checkpoint `{}` holds LoRA adapters of {theirs}, but this run trains {ours}",
        path.display()
    )]
    Adapters {
        path: PathBuf,
        theirs: String,
        ours: String,
    },
    #[error("checkpoint `{}` is at step {step}, beyond --steps {steps}", path.display())]
    BeyondSteps {
        path: PathBuf,
        step: usize,
        steps: usize,
    },
    #[error(
        "--stop-after {stop} is not beyond checkpoint `{}`, which is at step {step}",
        path.display()
    )]
    StopAfter {
        stop: usize,
        path: PathBuf,
        step: usize,
    },
}

/// `--batch`, `--seq-len`, `--accum`, `--gpus` and `--world-size` of a run:
/// what a resume must keep.
pub type RunShape = (usize, usize, usize, usize, usize);

/// The checkpoint a run continues from, read and checked before the model
/// is built.
pub(crate) struct Resume {
    pub(crate) path: PathBuf,
    /// The run that wrote it: this run continues it, in the same folder.
    pub(crate) run: String,
    pub(crate) state: TrainerState,
}

impl Resume {
    /// Reads `--resume`'s checkpoint (the newest written, for a folder of
    /// them) and checks that it continues this very run.
    pub(super) fn read(
        path: &Path,
        opts: &TrainOptions,
        config: &ModelConfig,
        tokenizer: &Tokenizer,
        corpus: (usize, u32),
        adapters: Option<&AdapterRun>,
    ) -> Result<Self, ResumeError> {
        let path = burn_offload::checkpoint::resolve(path)?;
        let manifest = burn_offload::checkpoint::read_manifest(&path)?;
        let state: TrainerState =
            serde_json::from_value(manifest.trainer).map_err(|error| ResumeError::State {
                path: path.clone(),
                error,
            })?;
        let here = || path.clone();
        let name = |c: &ModelConfig| serde_json::to_string(c).unwrap_or_default();
        if state.model != *config {
            return Err(ResumeError::Model {
                path: here(),
                theirs: name(&state.model),
                ours: name(config),
            });
        }
        if state.tokenizer != tokenizer.name() {
            return Err(ResumeError::Tokenizer {
                path: here(),
                theirs: state.tokenizer,
                ours: tokenizer.name().to_string(),
            });
        }
        if (state.corpus_tokens, state.corpus_crc32) != corpus {
            return Err(ResumeError::Data {
                path: here(),
                tokens: state.corpus_tokens,
            });
        }
        let same = match (&state.adapters, adapters) {
            (Some(theirs), Some(ours)) => theirs.continues(ours),
            (None, None) => true,
            _ => false,
        };
        if !same {
            let describe = |a: Option<&AdapterRun>| match a {
                Some(a) => serde_json::to_string(a).unwrap_or_default(),
                None => "no adapters (full training)".to_string(),
            };
            return Err(ResumeError::Adapters {
                path: here(),
                theirs: describe(state.adapters.as_ref()),
                ours: describe(adapters),
            });
        }
        let shape = |s: &TrainerState| (s.batch, s.seq_len, s.accum, s.gpus, s.processes);
        let ours = (
            opts.batch,
            opts.seq_len,
            opts.accum,
            opts.gpus,
            world_size(opts),
        );
        if shape(&state) != ours {
            return Err(ResumeError::Shape {
                path: here(),
                theirs: shape(&state),
                ours,
            });
        }
        if state.steps_done > opts.steps {
            return Err(ResumeError::BeyondSteps {
                path: here(),
                step: state.steps_done,
                steps: opts.steps,
            });
        }
        if let Some(stop) = opts.stop_after.filter(|&stop| stop <= state.steps_done) {
            return Err(ResumeError::StopAfter {
                stop,
                path: here(),
                step: state.steps_done,
            });
        }
        Ok(Self {
            path,
            run: manifest.run,
            state,
        })
    }
}

/// CRC32 of token ids as little-endian u32, the corpus identity checkpoints keep.
pub(crate) fn corpus_crc32(tokens: impl IntoIterator<Item = u32>) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h.finalize()
}
