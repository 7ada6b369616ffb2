//! A LoRA run's pieces around the loop: the adapters' config from the
//! options and the model's family, the model adapted and frozen, and the
//! adapters written as PEFT writes them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use burn_offload::{BlockModel, Compute, Frozen, FrozenDtype};
use models::hf::HfError;
use models::lora::{LoraConfig, LoraError, LoraModel, LoraTarget};
use models::peft::{save_peft, PeftDtype};
use models::ModelConfig;

use super::state::AdapterRun;
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

/// What a LoRA run's checkpoints record of its adapters and base, for a
/// resume to check (`None` without adapters).
pub(crate) fn adapter_run(
    opts: &TrainOptions,
    lora: Option<&LoraConfig>,
) -> Result<Option<AdapterRun>, HfError> {
    let Some(lora) = lora else {
        return Ok(None);
    };
    let base_crc32 = match &opts.init_from {
        Some(dir) => weights_crc32(dir)?,
        None => crc32fast::hash(&opts.seed.to_le_bytes()),
    };
    Ok(Some(AdapterRun {
        lora: lora.clone(),
        base_dtype: if opts.resident {
            "resident".to_string()
        } else {
            base_dtype(opts).name().to_string()
        },
        base: opts.init_from.clone(),
        base_crc32,
    }))
}

/// CRC32 of a checkpoint's weight files: each one's name, size and
/// safetensors header (every tensor's name, dtype, shape and byte range).
/// Reading the headers alone keeps it instant for a base of any size; a
/// different checkpoint has another header.
fn weights_crc32(dir: &Path) -> Result<u32, HfError> {
    let checkpoint = models::hf::Checkpoint::open(dir)?;
    let mut crc = crc32fast::Hasher::new();
    for (path, bytes) in checkpoint.files() {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        crc.update(name.unwrap_or_default().as_bytes());
        crc.update(&(bytes.len() as u64).to_le_bytes());
        // Opened as safetensors: an 8-byte header length, then the header.
        let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        crc.update(&bytes[..8 + len]);
    }
    Ok(crc.finalize())
}

/// How the offload engine holds the frozen base: `--base-dtype`, else the
/// compute precision (f32, or bf16 for a 16-bit compute).
pub(crate) fn base_dtype(opts: &TrainOptions) -> FrozenDtype {
    opts.lora.base_dtype.unwrap_or(match opts.compute {
        Compute::Fp32 => FrozenDtype::F32,
        _ => FrozenDtype::Base(burn_offload::quant::BaseDtype::Bf16),
    })
}

/// The parameters the offload engine holds frozen in `model` (adapted with
/// `lora`), and how; `None` without adapters.
pub(crate) fn frozen<X: Backend, M: LoraModel<X>>(
    model: &M,
    lora: Option<&LoraConfig>,
    opts: &TrainOptions,
) -> Option<Frozen> {
    lora.map(|config| Frozen {
        ids: model.frozen_ids(config),
        dtype: base_dtype(opts),
    })
}

/// Host bytes of the frozen base of a model of `config` adapted with
/// `lora` and held in `dtype`, counted on a model whose weights are never
/// drawn.
pub(crate) fn frozen_host_bytes(
    config: &ModelConfig,
    lora: &LoraConfig,
    dtype: FrozenDtype,
) -> u64 {
    type Counting = burn::backend::Flex;
    let device = Default::default();
    match config {
        ModelConfig::Llama(c) => base_bytes(c.init::<Counting>(&device), lora, dtype),
        ModelConfig::Gpt2(c) => base_bytes(c.init::<Counting>(&device), lora, dtype),
    }
}

fn base_bytes<X: Backend, M: LoraModel<X> + BlockModel<X>>(
    model: M,
    lora: &LoraConfig,
    dtype: FrozenDtype,
) -> u64 {
    // Adapters are never frozen: the model without them has the same
    // frozen parameters, and none of its weights is drawn.
    let frozen = model.frozen_ids(lora);
    let mut in_blocks = BlockParams(HashSet::new());
    for block in model.blocks() {
        block.visit(&mut in_blocks);
    }
    let mut count = FrozenBytes {
        frozen: &frozen,
        in_blocks: &in_blocks.0,
        dtype,
        bytes: 0,
    };
    model.visit(&mut count);
    count.bytes
}

/// Collects parameter ids.
struct BlockParams(HashSet<ParamId>);

impl<X: Backend> ModuleVisitor<X> for BlockParams {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<X, D>>) {
        self.0.insert(param.id);
    }
}

/// Sums the host bytes of the frozen parameters as `dtype` holds them.
struct FrozenBytes<'a> {
    frozen: &'a HashSet<ParamId>,
    in_blocks: &'a HashSet<ParamId>,
    dtype: FrozenDtype,
    bytes: u64,
}

impl<X: Backend> ModuleVisitor<X> for FrozenBytes<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<X, D>>) {
        if self.frozen.contains(&param.id) {
            let shape = param.lazy_shape().dims::<D>();
            let block = self.in_blocks.contains(&param.id);
            self.bytes += self.dtype.host_bytes(&shape, block) as u64;
        }
    }
}

/// The parameters that train with `lora` on a model of `config`: each
/// targeted projection's `rank × (in + out)`, and with `train_embeddings`
/// the embeddings and head, counted on a model whose weights are never
/// drawn (burn's lazy parameters), so a model of any size is counted at once.
pub(crate) fn trained_params(config: &ModelConfig, lora: &LoraConfig) -> u64 {
    type Counting = burn::backend::Flex;
    let device = Default::default();
    match config {
        ModelConfig::Llama(c) => count(&c.init::<Counting>(&device), lora),
        ModelConfig::Gpt2(c) => count(&c.init::<Counting>(&device), lora),
    }
}

fn count<X: Backend, M: LoraModel<X>>(model: &M, lora: &LoraConfig) -> u64 {
    let adapters: u64 = model
        .slots()
        .iter()
        .filter(|slot| lora.targets.iter().any(|t| t.matches(&slot.path)))
        .map(|slot| {
            let [d_in, d_out] = slot.base.weight.lazy_shape().dims::<2>();
            (lora.rank * (d_in + d_out)) as u64
        })
        .sum();
    let embeddings = if lora.train_embeddings {
        let mut visitor = Embeddings {
            names: M::EMBEDDINGS,
            depth: 0,
            inside: false,
            count: 0,
        };
        model.visit(&mut visitor);
        visitor.count
    } else {
        0
    };
    adapters + embeddings
}

/// Counts the parameters under the top-level modules `names`.
struct Embeddings {
    names: &'static [&'static str],
    depth: usize,
    inside: bool,
    count: u64,
}

impl<X: Backend> ModuleVisitor<X> for Embeddings {
    fn enter_module(&mut self, name: &str, _: &str) {
        if self.depth == 0 {
            self.inside = self.names.contains(&name);
        }
        self.depth += 1;
    }

    fn exit_module(&mut self, _: &str, _: &str) {
        self.depth -= 1;
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<X, D>>) {
        if self.inside {
            self.count += param.lazy_shape().num_elements() as u64;
        }
    }
}

/// Refuses an `--export-peft` folder as `--export-hf`'s is refused (never
/// `--overwrite`: adapters are small, and a new folder costs nothing), and
/// one that is `--export-hf`'s.
pub(crate) fn check_export(opts: &TrainOptions) -> Result<(), ExportError> {
    let Some(dir) = &opts.lora.export_peft else {
        return Ok(());
    };
    let mut sources = export::run_folders(opts);
    if let Some(path) = opts.export_hf.as_deref() {
        sources.push(export::Source {
            flag: export::HF,
            path,
        });
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

    /// `require_grad` is an autodiff backend's.
    type Ad = Autodiff<Flex>;

    /// Parameters with `require_grad`, on a model adapted for real.
    fn trainable<M: LoraModel<Ad>>(model: M, lora: &LoraConfig) -> u64 {
        struct Trainable(u64);
        impl ModuleVisitor<Ad> for Trainable {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
                if param.is_require_grad() {
                    self.0 += param.lazy_shape().num_elements() as u64;
                }
            }
        }
        let model = model.with_lora(lora, &Default::default()).unwrap();
        let mut visitor = Trainable(0);
        model.visit(&mut visitor);
        visitor.0
    }

    #[test]
    fn the_count_of_trained_parameters_is_what_an_adapted_model_trains() {
        use LoraTarget as T;
        let device = Default::default();
        for (preset, targets) in [
            ("llama-tiny", vec![T::QProj, T::VProj, T::DownProj]),
            ("gpt2-tiny", vec![T::CAttn, T::CProj]),
        ] {
            let config = ModelConfig::from_arg(preset).unwrap();
            for train_embeddings in [false, true] {
                let mut lora = LoraConfig::new(4, 8.0, targets.clone());
                lora.train_embeddings = train_embeddings;
                let real = match &config {
                    ModelConfig::Llama(c) => trainable(c.init::<Ad>(&device), &lora),
                    ModelConfig::Gpt2(c) => trainable(c.init::<Ad>(&device), &lora),
                };
                let counted = trained_params(&config, &lora);
                assert_eq!(counted, real, "{preset}, embeddings {train_embeddings}");
                assert!(counted > 0 && counted < config.num_params() as u64);
            }
        }
    }
}

#[cfg(test)]
mod plan_tests {
    use burn_offload::quant::BaseDtype;
    use burn_offload::Compute;

    use crate::options::TrainOptions;
    use crate::plan::Machine;
    use models::ModelConfig;

    const GIB: u64 = 1 << 30;

    /// A machine of `host` GiB of memory and a GPU of `gpu` GiB.
    fn machine(host: u64, gpu: u64) -> Machine {
        Machine {
            host_bytes: host * GIB,
            host_source: "test".into(),
            device_bytes: Some(gpu * GIB),
            device_source: "test".into(),
        }
    }

    /// One sequence of `seq_len` tokens a step, rank-16 adapters.
    fn lora_options(seq_len: usize, compute: Compute) -> TrainOptions {
        let mut opts = TrainOptions {
            batch: 1,
            seq_len,
            compute,
            ..TrainOptions::default()
        };
        opts.lora.lora_rank = 16;
        opts
    }

    /// A resident Llama-1B fine-tune on a 12 GiB GPU: every weight's
    /// gradient and Adam state do not fit; the frozen base with rank-16
    /// adapters does, and its plan counts optimizer state for the adapters
    /// only.
    #[test]
    fn a_lora_plan_holds_state_for_the_adapters_only() {
        let machine = machine(64, 12);
        let config = ModelConfig::from_arg("llama-1b").unwrap();
        let mut opts = TrainOptions {
            resident: true,
            batch: 1,
            seq_len: 512,
            ..TrainOptions::default()
        };
        let (full, job) = super::super::plan(&opts, config.clone(), &machine);
        assert_eq!(job.trained_params, None);
        assert!(full.check(&job, &machine).is_err());
        opts.lora.lora_rank = 16;
        let (lora, job) = super::super::plan(&opts, config.clone(), &machine);
        let trained = job.trained_params.expect("LoRA counts its parameters");
        assert!(trained * 100 < config.num_params() as u64);
        lora.check(&job, &machine).unwrap();
    }

    /// The engine's LoRA plan counts the base as `--base-dtype` holds it:
    /// Llama-3.1-8B's base in NF4 is about half a byte a parameter (its
    /// embeddings and head stay bf16), in bf16 two.
    #[test]
    fn an_engine_lora_plan_counts_the_base_in_its_format() {
        let machine = machine(125, 80);
        let config = ModelConfig::from_arg("llama-3.1-8b").unwrap();
        let params = config.num_params() as f64;
        let mut opts = lora_options(1024, Compute::Fp32);
        let mut frozen = |base: BaseDtype| {
            opts.lora.base_dtype = Some(burn_offload::FrozenDtype::Base(base));
            let (_, job) = super::super::plan(&opts, config.clone(), &machine);
            job.frozen_host_bytes.expect("counted") as f64 / params
        };
        let (nf4, bf16) = (frozen(BaseDtype::Nf4), frozen(BaseDtype::Bf16));
        // The 8B's bf16 embeddings and head are an eighth of it.
        assert!((0.65..0.8).contains(&nf4), "NF4: {nf4} B/param");
        assert!((bf16 - 2.0).abs() < 1e-9, "bf16: {bf16} B/param");
    }

    /// The plan names the largest preset each base format fits, and a base
    /// too large in bf16 is told the format that fits: a 70B LoRA on a
    /// 125 GiB host streams in NF4 or int8, not in bf16.
    #[test]
    fn a_lora_plan_names_the_largest_base_and_the_format_that_fits() {
        let machine = machine(125, 24);
        let opts = lora_options(1024, Compute::Bf16);
        let largest: Vec<(String, Option<&str>)> =
            super::super::largest_lora_bases(&opts, &machine)
                .into_iter()
                .map(|(dtype, largest)| (dtype.name().to_string(), largest.map(|(name, _)| name)))
                .collect();
        assert_eq!(
            largest,
            [
                ("bf16".to_string(), Some("qwen2.5-32b")),
                ("int8".to_string(), Some("qwen2.5-72b")),
                ("nf4".to_string(), Some("qwen2.5-72b")),
            ]
        );
        let config = ModelConfig::from_arg("llama-3.1-70b").unwrap();
        let (plan, job) = super::super::plan(&opts, config, &machine);
        let why = plan.check(&job, &machine).unwrap_err().to_string();
        assert!(why.contains("try --base-dtype int8"), "{why}");
        assert!(why.contains("2.00 B/param for the frozen base"), "{why}");
    }

    /// The device side of a LoRA plan on the Llama-3.1-70B shape with an NF4
    /// base: its frozen stem binds in bf16 (2.1B parameters, 3.9 GiB, where
    /// a trained one binds in f32) and its head has no weight gradient (a
    /// full fine-tune's head phase holds an f32 one, another 3.9 GiB).
    #[test]
    fn a_lora_plan_binds_a_frozen_stem_in_the_compute_precision_without_a_head_gradient() {
        let machine = machine(125, 24);
        let mut opts = lora_options(4096, Compute::Bf16);
        opts.lora.base_dtype = Some(burn_offload::FrozenDtype::Base(BaseDtype::Nf4));
        let config = ModelConfig::from_arg("llama-3.1-70b").unwrap();
        let (_, job) = super::super::plan(&opts, config, &machine);
        let job = crate::plan::Job { gpu: true, ..job }.placed(&machine);
        let plan = crate::plan::Plan::new(&job);
        let bytes = |what: &str| {
            plan.device
                .iter()
                .find(|i| i.what.starts_with(what))
                .map(|i| i.bytes)
                .unwrap()
        };
        // The stem (2.1B) and three blocks (0.86B each) in bf16.
        let weights = bytes("weights: stem") as f64 / GIB as f64;
        assert!((8.0..9.5).contains(&weights), "{weights} GiB of weights");
        // 4,096 tokens' logits and their softmax, nothing of the head's size.
        let head = bytes("LM head") as f64 / GIB as f64;
        assert!(
            (9.0..10.5).contains(&head),
            "{head} GiB in the head's phase"
        );
    }
}
