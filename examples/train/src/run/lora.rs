//! A LoRA run's pieces around the loop: the adapters' config from the
//! options and the model's family, the model adapted and frozen, and the
//! adapters written as PEFT writes them.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use models::lora::{LoraConfig, LoraError, LoraModel, LoraTarget};
use models::peft::{save_peft, PeftDtype};
use models::ModelConfig;

use crate::export::{self, ExportError};
use crate::options::TrainOptions;

/// The targets PEFT picks for a family when `target_modules` is not given
/// (its `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`).
fn default_targets(config: &ModelConfig) -> Vec<LoraTarget> {
    match config {
        ModelConfig::Llama(_) => vec![LoraTarget::QProj, LoraTarget::VProj],
        ModelConfig::Gpt2(_) => vec![LoraTarget::CAttn],
    }
}

/// Whether `target` names a projection of `config`'s family.
fn in_family(target: LoraTarget, config: &ModelConfig) -> bool {
    use LoraTarget as T;
    let llama = matches!(
        target,
        T::QProj | T::KProj | T::VProj | T::OProj | T::GateProj | T::UpProj | T::DownProj
    );
    llama == matches!(config, ModelConfig::Llama(_))
}

/// The adapters the options ask for on a model of `config`'s family, or
/// `None` without `--lora-rank`. Checked here, before anything is read: the
/// target names and that each names a projection of this family.
pub(crate) fn lora_config(
    opts: &TrainOptions,
    config: &ModelConfig,
) -> Result<Option<LoraConfig>, LoraError> {
    let lora = &opts.lora;
    if !lora.enabled() {
        return Ok(None);
    }
    let targets = if lora.lora_targets.is_empty() {
        default_targets(config)
    } else {
        lora.lora_targets
            .iter()
            .map(|name| name.parse())
            .collect::<Result<Vec<LoraTarget>, _>>()?
    };
    if let Some(target) = targets.iter().find(|t| !in_family(**t, config)) {
        return Err(LoraError::UnsupportedTarget {
            target: target.name().into(),
            model: match config {
                ModelConfig::Llama(_) => "a Llama-family model",
                ModelConfig::Gpt2(_) => "GPT-2",
            },
        });
    }
    let mut adapters = LoraConfig::new(lora.lora_rank, lora.lora_alpha, targets);
    adapters.dropout = lora.lora_dropout;
    adapters.rslora = lora.rslora;
    adapters.train_embeddings = lora.train_embeddings;
    adapters.validate()?;
    Ok(Some(adapters))
}

/// `model` with adapters and its base frozen where `lora` is given.
pub(crate) fn adapt<X: Backend, M: LoraModel<X>>(
    model: M,
    lora: Option<&LoraConfig>,
    device: &X::Device,
) -> Result<M, LoraError> {
    match lora {
        Some(config) => model.with_lora(config, device),
        None => Ok(model),
    }
}

/// Refuses an `--export-peft` folder as `--export-hf`'s is refused (never
/// `--overwrite`: adapters are small, and a new folder costs nothing), and
/// one that is `--export-hf`'s.
pub(crate) fn check_export(opts: &TrainOptions) -> Result<(), ExportError> {
    let Some(dir) = &opts.lora.export_peft else {
        return Ok(());
    };
    let sources: Vec<export::Source<'_>> = [
        ("--init-from", &opts.init_from),
        ("--resume", &opts.resume),
        ("--checkpoint-dir", &opts.checkpoint_dir),
        ("--export-hf", &opts.export_hf),
    ]
    .into_iter()
    .filter_map(|(flag, path)| path.as_deref().map(|path| export::Source { flag, path }))
    .collect();
    export::check(export::PEFT, dir, false, &sources)
}

/// Writes `model`'s adapters to `--export-peft` (staged beside it, then
/// renamed into place); returns where they went.
pub(crate) fn export_peft<X: Backend, M: LoraModel<X>>(
    opts: &TrainOptions,
    model: &M,
    config: &LoraConfig,
) -> Result<Option<PathBuf>, ExportError> {
    let Some(dir) = &opts.lora.export_peft else {
        return Ok(None);
    };
    let base = base_model_name(opts);
    export::write(export::PEFT, dir, |staging| {
        save_peft(model, config, &base, staging, PeftDtype::F32)?;
        Ok(())
    })?;
    Ok(Some(dir.clone()))
}

/// PEFT's `base_model_name_or_path`: the `--init-from` folder as given
/// (made absolute), else the `--model` preset or config.
fn base_model_name(opts: &TrainOptions) -> String {
    match &opts.init_from {
        Some(dir) => std::path::absolute(dir)
            .unwrap_or_else(|_| dir.clone())
            .display()
            .to_string(),
        None => Path::new(&opts.model).display().to_string(),
    }
}
