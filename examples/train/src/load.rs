//! A model folder to generate with: a Hugging Face folder (`config.json`,
//! `*.safetensors`, the tokenizer's files) or a checkpoint `train
//! --checkpoint-dir` wrote (a `step-<N>` folder, or the folder holding
//! them: its newest), read with the loaders training uses
//! (`models::hf`, the engine's checkpoints), its tokenizer and the tokens
//! that end a turn.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn_offload::checkpoint::{self, CheckpointError};
use burn_offload::{Compute, Engine, EngineConfig, EngineError, HostValues, StreamedModel};
use models::hf::HfError;
use models::LoraModel;
use models::ModelConfig;
use serde_json::Value;

use crate::run::TrainerState;
use crate::tokenizer::{Tokenizer, TokenizerError, TOKENIZER_FILE};

/// Why a folder could not be loaded to generate with.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// `--adapter`'s folder, or its tensors against the model.
    #[error("--adapter: {0}")]
    Adapter(#[from] models::PeftError),
    #[error(
        "--adapter: a `train` checkpoint streamed from host memory takes no adapters yet (a Hugging \
         Face folder does); merge them with `train --export-hf DIR --merge-lora`, or give the \
         model the GPU it needs"
    )]
    StreamedAdapter,
    #[error("`{}` does not exist", .0.display())]
    NotFound(PathBuf),
    #[error(
        "`{}` is neither a Hugging Face model folder (config.json and *.safetensors) nor a \
         checkpoint folder of train (step-<N> folders with a manifest.json)",
        .0.display()
    )]
    Unknown(PathBuf),
    #[error(
        "`{}` has no tokenizer.json: generation needs the model's tokenizer; copy it into the \
         folder or give --tokenizer",
        .0.display()
    )]
    NoTokenizer(PathBuf),
    #[error(
        "checkpoint `{}` was trained with the tokenizer `{name}`, a tokenizer.json checkpoints \
         do not keep: give it with --tokenizer (the run's --tokenizer, or its --init-from folder)",
        path.display()
    )]
    CheckpointTokenizer { path: PathBuf, name: String },
    #[error(
        "--tokenizer `{given}` is `{got}`, but checkpoint `{}` was trained with `{want}`",
        path.display()
    )]
    WrongTokenizer {
        path: PathBuf,
        given: String,
        got: String,
        want: String,
    },
    #[error("checkpoint `{}` has no readable trainer state: {why}", path.display())]
    State { path: PathBuf, why: String },
    #[error(
        "the model's vocabulary ({model}) is smaller than the {name} tokenizer's ({tokenizer})"
    )]
    Vocabulary {
        model: usize,
        name: String,
        tokenizer: usize,
    },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Hf(#[from] HfError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Where the weights are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Weights {
    /// A Hugging Face folder.
    Hf(PathBuf),
    /// One checkpoint of `train` (its `step-<N>` folder).
    Checkpoint(PathBuf),
}

/// A folder's model, tokenizer and stop tokens, read and checked; no weight
/// is read yet.
pub struct ModelFolder {
    pub weights: Weights,
    pub config: ModelConfig,
    pub tokenizer: Tokenizer,
    /// The tokens that end a reply: the end-of-sequence tokens the folder's
    /// configs name, and the end-of-turn tokens of the vocabulary.
    pub stop_ids: Vec<u32>,
    /// PEFT adapters merged into the weights as they load
    /// ([`ModelFolder::with_adapter`]).
    pub adapter: Option<PathBuf>,
}

/// End-of-turn tokens of the chat templates in use, stopped at wherever
/// the vocabulary has them.
const END_OF_TURN: [&str; 5] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
];

impl ModelFolder {
    /// Reads `path`'s config and tokenizer (`tokenizer`, the `--tokenizer`
    /// flag, where given).
    pub fn open(path: &Path, tokenizer: Option<&str>) -> Result<Self, LoadError> {
        if !path.exists() {
            return Err(LoadError::NotFound(path.to_path_buf()));
        }
        let (weights, config, tokenizer) = if path.join("config.json").is_file() {
            let config = models::hf::load_config(path)?;
            let tokenizer = match tokenizer {
                Some(name) => Tokenizer::from_name(name)?,
                None if path.join(TOKENIZER_FILE).is_file() => {
                    Tokenizer::for_run(None, Some(path))?
                }
                None => return Err(LoadError::NoTokenizer(path.to_path_buf())),
            };
            (Weights::Hf(path.to_path_buf()), config, tokenizer)
        } else {
            let found = checkpoint::resolve(path).map_err(|e| match e {
                CheckpointError::NotFound(_) => LoadError::Unknown(path.to_path_buf()),
                e => e.into(),
            })?;
            let manifest = checkpoint::read_manifest(&found)?;
            let state: TrainerState =
                serde_json::from_value(manifest.trainer).map_err(|why| LoadError::State {
                    path: found.clone(),
                    why: why.to_string(),
                })?;
            let tokenizer = match tokenizer {
                Some(name) => {
                    let tokenizer = Tokenizer::from_name(name)?;
                    if tokenizer.name() != state.tokenizer {
                        return Err(LoadError::WrongTokenizer {
                            path: found,
                            given: name.to_string(),
                            got: tokenizer.name().to_string(),
                            want: state.tokenizer,
                        });
                    }
                    tokenizer
                }
                None if crate::tokenizer::TOKENIZER_NAMES.contains(&state.tokenizer.as_str()) => {
                    Tokenizer::from_name(&state.tokenizer)?
                }
                None => {
                    return Err(LoadError::CheckpointTokenizer {
                        path: found,
                        name: state.tokenizer,
                    })
                }
            };
            (Weights::Checkpoint(found), state.model, tokenizer)
        };
        if config.vocab_size() < tokenizer.vocab_size() {
            return Err(LoadError::Vocabulary {
                model: config.vocab_size(),
                name: tokenizer.name().to_string(),
                tokenizer: tokenizer.vocab_size(),
            });
        }
        let mut stop_ids: Vec<u32> = tokenizer.specials().eos.map(|s| s.id).into_iter().collect();
        if let Weights::Hf(dir) = &weights {
            stop_ids.extend(eos_ids(dir));
        }
        stop_ids.extend(END_OF_TURN.iter().filter_map(|t| tokenizer.token_id(t)));
        stop_ids.retain(|&id| (id as usize) < config.vocab_size());
        stop_ids.sort_unstable();
        stop_ids.dedup();
        Ok(Self {
            adapter: None,
            weights,
            config,
            tokenizer,
            stop_ids,
        })
    }

    /// The folder's model with the PEFT adapters of `dir` (as `train
    /// --export-peft` or PEFT write them) merged into its weights when it
    /// loads; their config is read now, so a bad folder costs no loading.
    pub fn with_adapter(mut self, dir: &Path) -> Result<Self, LoadError> {
        models::peft::read_adapter_config(&dir.join(models::peft::ADAPTER_CONFIG))?;
        self.adapter = Some(dir.to_path_buf());
        Ok(self)
    }

    /// The whole model on `device` in the compute precision, from the
    /// lazily initialised `init` (never drawn for a Hugging Face folder),
    /// with the adapters merged in where given.
    pub fn resident<B, M>(
        &self,
        init: impl FnOnce() -> M,
        compute: Compute,
        device: &B::Device,
    ) -> Result<M, LoadError>
    where
        B: Backend,
        M: StreamedModel<B> + LoraModel<B>,
    {
        let model = match &self.weights {
            Weights::Hf(dir) => models::hf::load_weights(init(), &self.config, dir)?,
            Weights::Checkpoint(_) => self
                .loaded_engine(init, Compute::Fp32, device, None)?
                .model(),
        };
        // Merged in fp32, before the cast: one rounding, as a merged export.
        let model = match &self.adapter {
            Some(dir) => models::load_peft(model, dir)?.merge_lora(),
            None => model,
        };
        Ok(burn_offload::cast_params(model, compute.dtype()))
    }

    /// The model in the engine's host store, its blocks streamed through
    /// `device` in the compute precision one at a time (a model larger than
    /// the device), with the adapters merged in where given.
    pub fn engine<B, M>(
        &self,
        init: impl FnOnce() -> M,
        compute: Compute,
        device: &B::Device,
    ) -> Result<Engine<B, M>, LoadError>
    where
        B: Backend,
        M: StreamedModel<B> + LoraModel<B>,
    {
        self.loaded_engine(init, compute, device, self.adapter.as_deref())
    }

    fn loaded_engine<B, M>(
        &self,
        init: impl FnOnce() -> M,
        compute: Compute,
        device: &B::Device,
        adapter: Option<&Path>,
    ) -> Result<Engine<B, M>, LoadError>
    where
        B: Backend,
        M: StreamedModel<B> + LoraModel<B>,
    {
        // No gradients and the smallest moments: the store holds the
        // weights (and 2 bytes a parameter of moments it never reads). No
        // host work shares the cores, so a wait for the device spins: each
        // token's wait for its id ends sooner than a sleeping one would.
        let config = EngineConfig {
            fused: true,
            eight_bit_moments: true,
            overlap: false,
            blocking_sync: false,
            compute,
            ..EngineConfig::default()
        };
        let devices = std::slice::from_ref(device);
        match &self.weights {
            // The store takes the tensors from the files on the host (none
            // is drawn on the device), the adapters merged in as they are
            // read.
            Weights::Hf(dir) => {
                let (model, values) =
                    models::hf::load_weights_for_store(init(), &self.config, dir)?;
                let merged;
                let values: &dyn HostValues = match adapter {
                    Some(adapter) => {
                        merged = models::peft::merged_values(&model, values, adapter)?;
                        &merged
                    }
                    None => &values,
                };
                Ok(Engine::with_host_values(
                    model, values, None, config, devices,
                )?)
            }
            Weights::Checkpoint(_) if adapter.is_some() => Err(LoadError::StreamedAdapter),
            // The weights are drawn into the store one tensor at a time, then
            // read over from the checkpoint: none is on the device whole.
            Weights::Checkpoint(path) => {
                let mut engine = Engine::new(init(), config, device)?;
                engine.load_weights(path)?;
                Ok(engine)
            }
        }
    }
}

/// The `eos_token_id`s (a number or a list) of a Hugging Face folder's
/// `generation_config.json` and `config.json`.
fn eos_ids(dir: &Path) -> Vec<u32> {
    ["generation_config.json", "config.json"]
        .iter()
        .filter_map(|name| models::hf::read_json(&dir.join(name)).ok())
        .filter_map(|config| config.get("eos_token_id").cloned())
        .flat_map(|ids| match ids {
            Value::Array(list) => list.iter().filter_map(Value::as_u64).collect(),
            id => id.as_u64().into_iter().collect::<Vec<_>>(),
        })
        .map(|id| id as u32)
        .collect()
}
