//! Continuing a run from its checkpoint: the state read back and checked
//! against this run's data and options.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use models::ModelConfig;

use super::machine::*;
use super::state::*;
use crate::options::*;
use crate::tokenizer::Tokenizer;

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
    ) -> Result<Self> {
        let path = burn_offload::checkpoint::resolve(path)?;
        let manifest = burn_offload::checkpoint::read_manifest(&path)?;
        let state: TrainerState = serde_json::from_value(manifest.trainer).map_err(|why| {
            anyhow::anyhow!(
                "checkpoint `{}` has no readable trainer state: {why}",
                path.display()
            )
        })?;
        let here = path.display();
        let name = |c: &ModelConfig| serde_json::to_string(c).unwrap_or_default();
        if state.model != *config {
            bail!(
                "checkpoint `{here}` is for model {}, but --model gives {}",
                name(&state.model),
                name(config)
            );
        }
        if state.tokenizer != tokenizer.name() {
            bail!(
                "checkpoint `{here}` was trained with tokenizer `{}`, not `{}`",
                state.tokenizer,
                tokenizer.name()
            );
        }
        if (state.corpus_tokens, state.corpus_crc32) != corpus {
            bail!("checkpoint `{here}` was trained on other data ({} tokens); resume with the same --data and --tokenizer", state.corpus_tokens);
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
            bail!(
                "checkpoint `{here}` used --batch/--seq-len/--accum/--gpus/--world-size {:?}, not {ours:?}",
                shape(&state)
            );
        }
        if state.steps_done > opts.steps {
            bail!(
                "checkpoint `{here}` is at step {}, beyond --steps {}",
                state.steps_done,
                opts.steps
            );
        }
        if let Some(stop) = opts.stop_after.filter(|&stop| stop <= state.steps_done) {
            bail!(
                "--stop-after {stop} is not beyond checkpoint `{here}`, which is at step {}",
                state.steps_done
            );
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
