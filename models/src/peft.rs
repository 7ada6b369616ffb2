//! PEFT's adapter files out and in: `adapter_model.safetensors` and
//! `adapter_config.json`, as `peft.PeftModel.from_pretrained` reads them
//! over a `transformers` model.
//!
//! Tensors are named `base_model.model.<module>.lora_A.weight` (`[r, in]`)
//! and `….lora_B.weight` (`[out, r]`), `<module>` being the projection's
//! Hugging Face path (`model.layers.0.self_attn.q_proj`,
//! `transformer.h.0.attn.c_attn`). Our adapters hold A and B in that very
//! layout, so they are written as they are. GPT-2's projections are
//! `Conv1D`s that store `[in, out]`: PEFT wraps them with
//! `fan_in_fan_out=True`, which transposes only the merged `B·A` when
//! folding it into the weight; `lora_A`/`lora_B` keep the `[r, in]` /
//! `[out, r]` shapes, so GPT-2's files differ from Llama's only in that
//! flag in `adapter_config.json`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use burn::module::{Param, ParamId};
use burn::nn::DropoutConfig;
use burn::tensor::{backend::Backend, bf16, Tensor, TensorData};
use burn_offload::HostValues;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, SafeTensors, View};
use serde_json::{json, Value};

use crate::lora::{LoraConfig, LoraError, LoraModel, LoraTarget};

/// The adapter weights' file name.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// The adapter config's file name.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// What PEFT puts before a `transformers` module path.
const PREFIX: &str = "base_model.model.";

/// The dtype adapter tensors are written in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PeftDtype {
    /// 32-bit floats, exact.
    #[default]
    F32,
    /// bfloat16, half the size (what PEFT saves for a bf16 model).
    Bf16,
}

/// Why PEFT files could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum PeftError {
    /// A file could not be read or written (the OS error in the message, not
    /// a `source`, so that error-chain printers do not repeat it).
    #[error("`{}`: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// An adapter file is absent.
    #[error("missing PEFT file `{}`", path.display())]
    MissingFile {
        /// The file.
        path: PathBuf,
    },
    /// A file's content is not what PEFT writes.
    #[error("`{}`: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The config's LoRA settings cannot apply to the model (unknown or
    /// unsupported target, bad rank).
    #[error("`{}`: {source}", path.display())]
    Lora {
        /// The config file.
        path: PathBuf,
        /// The LoRA error.
        source: LoraError,
    },
    /// A tensor the model's adapters need is absent.
    #[error("`{}` has no tensor `{name}`", path.display())]
    MissingTensor {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
    },
    /// A tensor that no adapter of the model reads.
    #[error("`{}` holds `{name}`, which no adapter of the model reads", path.display())]
    UnexpectedTensor {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
    },
    /// A tensor's shape differs from the adapter's.
    #[error("tensor `{name}` has shape {got:?}, the model expects {want:?}")]
    Shape {
        /// The tensor's name.
        name: String,
        /// Its shape in the file.
        got: Vec<usize>,
        /// The adapter's.
        want: Vec<usize>,
    },
    /// A tensor in a dtype we do not read.
    #[error("tensor `{name}` has dtype {dtype}; supported: F32, BF16, F16")]
    Dtype {
        /// The tensor's name.
        name: String,
        /// Its dtype.
        dtype: String,
    },
    /// The model's adapters differ from the file's in rank or placement.
    #[error("the model's adapters do not match `{}`: {reason}", path.display())]
    Mismatch {
        /// The config file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// Saving a model that carries no adapter.
    #[error("the model carries no LoRA adapter to save")]
    NoAdapters,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PeftError + '_ {
    move |error| PeftError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// PEFT's name of an adapter matrix (`"A"` or `"B"`) of module `path`.
pub fn tensor_name(path: &str, matrix: &str) -> String {
    format!("{PREFIX}{path}.lora_{matrix}.weight")
}

/// `adapter_config.json` for `config` over `base_model` (a hub id or a
/// path, as the caller wants PEFT to find the base model).
pub fn adapter_config(config: &LoraConfig, base_model: &str, fan_in_fan_out: bool) -> Value {
    let targets: Vec<&str> = config.targets.iter().map(LoraTarget::name).collect();
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": targets,
        "use_rslora": config.rslora,
        "bias": "none",
        "fan_in_fan_out": fan_in_fan_out,
        "base_model_name_or_path": base_model,
        "inference_mode": true,
        "modules_to_save": null,
        "init_lora_weights": true,
    })
}

/// An adapter tensor's bytes, for `safetensors`.
struct Bytes {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Bytes {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.data[..]).into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn bytes<B: Backend>(tensor: Tensor<B, 2>, dtype: PeftDtype) -> Bytes {
    let shape = tensor.dims().to_vec();
    let values = tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 values");
    let (dtype, data) = match dtype {
        PeftDtype::F32 => (
            Dtype::F32,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        PeftDtype::Bf16 => (
            Dtype::BF16,
            values
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
    };
    Bytes { dtype, shape, data }
}

/// Writes `model`'s adapters as PEFT does into `dir` (created): the
/// weights in `dtype` and the config of `config` over `base_model`. Fails
/// on a model without adapters or with adapters of another rank.
pub fn save_peft<B: Backend, M: LoraModel<B>>(
    model: &M,
    config: &LoraConfig,
    base_model: &str,
    dir: &Path,
    dtype: PeftDtype,
) -> Result<(), PeftError> {
    let config_path = dir.join(ADAPTER_CONFIG);
    let mut tensors = Vec::new();
    for slot in model.slots() {
        let Some(lora) = slot.lora else { continue };
        if lora.rank() != config.rank {
            return Err(PeftError::Mismatch {
                path: config_path,
                reason: format!(
                    "`{}` has rank {}, not {}",
                    slot.path,
                    lora.rank(),
                    config.rank
                ),
            });
        }
        tensors.push((
            tensor_name(&slot.path, "A"),
            bytes(lora.lora_a.val(), dtype),
        ));
        tensors.push((
            tensor_name(&slot.path, "B"),
            bytes(lora.lora_b.val(), dtype),
        ));
    }
    if tensors.is_empty() {
        return Err(PeftError::NoAdapters);
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let weights = dir.join(ADAPTER_WEIGHTS);
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let views = tensors.iter().map(|(name, b)| (name.clone(), b));
    safetensors::serialize_to_file(views, metadata, &weights).map_err(|e| PeftError::Io {
        path: weights.clone(),
        error: std::io::Error::other(e.to_string()),
    })?;
    let json = adapter_config(config, base_model, M::FAN_IN_FAN_OUT);
    let text = serde_json::to_string_pretty(&json).expect("config serialises");
    std::fs::write(&config_path, text).map_err(io(&config_path))
}

/// The LoRA settings of an `adapter_config.json`.
pub fn read_adapter_config(path: &Path) -> Result<LoraConfig, PeftError> {
    if !path.is_file() {
        return Err(PeftError::MissingFile { path: path.into() });
    }
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let invalid = |reason: String| PeftError::Invalid {
        path: path.into(),
        reason,
    };
    let json: Value =
        serde_json::from_str(&text).map_err(|e| invalid(format!("invalid JSON: {e}")))?;
    let peft_type = json.get("peft_type").and_then(Value::as_str);
    if peft_type != Some("LORA") {
        return Err(invalid(format!("peft_type {peft_type:?}, not \"LORA\"")));
    }
    let number = |key: &str| {
        json.get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| invalid(format!("missing or non-numeric `{key}`")))
    };
    let rank = json
        .get("r")
        .and_then(Value::as_u64)
        .ok_or_else(|| invalid("missing or non-integer `r`".into()))? as usize;
    // PEFT also takes a regular expression (a string) here; we match names.
    let names = json
        .get("target_modules")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("`target_modules` is not a list of names".into()))?;
    let lora = |source| PeftError::Lora {
        path: path.into(),
        source,
    };
    let mut targets = Vec::new();
    for name in names {
        let name = name
            .as_str()
            .ok_or_else(|| invalid(format!("target {name} is not a string")))?;
        targets.push(name.parse().map_err(lora)?);
    }
    let config = LoraConfig {
        rank,
        alpha: number("lora_alpha")?,
        dropout: json
            .get("lora_dropout")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
        targets,
        rslora: json.get("use_rslora").and_then(Value::as_bool) == Some(true),
        train_embeddings: false,
    };
    config.validate().map_err(lora)?;
    Ok(config)
}

/// `model` with the adapters saved in `dir`. A model without adapters gets
/// them first ([`LoraModel::with_lora`] with the file's settings, base
/// frozen); one with adapters must have them on exactly the projections
/// the file targets, at its rank. Every tensor is checked before any is
/// used; the adapters take the file's scale and dropout.
pub fn load_peft<B: Backend, M: LoraModel<B>>(model: M, dir: &Path) -> Result<M, PeftError> {
    let config_path = dir.join(ADAPTER_CONFIG);
    let config = read_adapter_config(&config_path)?;
    let mismatch = |reason: String| PeftError::Mismatch {
        path: config_path.clone(),
        reason,
    };
    let mut model = if model.slots().iter().all(|s| s.lora.is_none()) {
        let device = model.slots()[0].base.weight.lazy_device();
        model
            .with_lora(&config, &device)
            .map_err(|source| PeftError::Lora {
                path: config_path.clone(),
                source,
            })?
    } else {
        for slot in model.slots() {
            let targeted = config.targets.iter().any(|t| t.matches(&slot.path));
            match slot.lora {
                Some(_) if !targeted => {
                    return Err(mismatch(format!("`{}` is not a target", slot.path)))
                }
                None if targeted => {
                    return Err(mismatch(format!("`{}` has no adapter", slot.path)))
                }
                Some(lora) if lora.rank() != config.rank => {
                    let rank = lora.rank();
                    return Err(mismatch(format!(
                        "`{}` has rank {rank}, the file {}",
                        slot.path, config.rank
                    )));
                }
                _ => {}
            }
        }
        model
    };

    let (weights, bytes) = read_weights(dir)?;
    let file = parse_weights(&weights, &bytes)?;
    // Read all first: a bad tensor leaves no adapter half-loaded.
    let mut read = Vec::new();
    let mut wanted = BTreeSet::new();
    for slot in model.slots() {
        let Some(lora) = slot.lora else { continue };
        for (matrix, param) in [("A", &lora.lora_a), ("B", &lora.lora_b)] {
            let name = tensor_name(&slot.path, matrix);
            let want = param.lazy_shape().to_vec();
            read.push(tensor(&file, &weights, &name, want)?);
            wanted.insert(name);
        }
    }
    only_wanted(&file, weights, &wanted)?;
    let mut read = read.into_iter();
    let dropout = (config.dropout > 0.0).then(|| DropoutConfig::new(config.dropout).init());
    for slot in model.slots_mut() {
        let Some(lora) = slot.lora.as_mut() else {
            continue;
        };
        let device = lora.lora_a.lazy_device();
        for param in [&mut lora.lora_a, &mut lora.lora_b] {
            let data = read.next().expect("one read per matrix");
            let value = Tensor::<B, 2>::from_data(data, &device).require_grad();
            *param = Param::initialized(param.id, value);
        }
        lora.scale = config.scale();
        lora.dropout = dropout.clone();
    }
    Ok(model)
}

/// The path and bytes of the adapter weights in `dir`.
fn read_weights(dir: &Path) -> Result<(PathBuf, Vec<u8>), PeftError> {
    let weights = dir.join(ADAPTER_WEIGHTS);
    if !weights.is_file() {
        return Err(PeftError::MissingFile { path: weights });
    }
    let bytes = std::fs::read(&weights).map_err(io(&weights))?;
    Ok((weights, bytes))
}

/// The adapter weights file at `path`, read as `bytes`.
fn parse_weights<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>, PeftError> {
    SafeTensors::deserialize(bytes).map_err(|e| PeftError::Invalid {
        path: path.into(),
        reason: e.to_string(),
    })
}

/// Refuses a file holding a tensor besides the `wanted` ones.
fn only_wanted(
    file: &SafeTensors,
    path: PathBuf,
    wanted: &BTreeSet<String>,
) -> Result<(), PeftError> {
    match file.names().into_iter().find(|n| !wanted.contains(*n)) {
        Some(name) => Err(PeftError::UnexpectedTensor {
            path,
            name: name.to_string(),
        }),
        None => Ok(()),
    }
}

/// Tensor `name` of `file` as f32, checked to have shape `want`.
fn tensor(
    file: &SafeTensors,
    path: &Path,
    name: &str,
    want: Vec<usize>,
) -> Result<TensorData, PeftError> {
    let t = file.tensor(name).map_err(|_| PeftError::MissingTensor {
        path: path.into(),
        name: name.into(),
    })?;
    if t.shape() != want {
        return Err(PeftError::Shape {
            name: name.into(),
            got: t.shape().to_vec(),
            want,
        });
    }
    let values = crate::hf::f32_values(&t).ok_or_else(|| PeftError::Dtype {
        name: name.into(),
        dtype: format!("{:?}", t.dtype()),
    })?;
    Ok(TensorData::new(values, want))
}

/// A checkpoint's values with the PEFT adapters of a folder merged in
/// (`W + scale·(B·A)ᵀ` in burn's layout, in f32), read on the host as an
/// engine's store takes them: what [`load_peft`] then `merge_lora` give,
/// without the model on a device (a model streamed from host memory).
pub struct MergedValues<V> {
    base: V,
    deltas: HashMap<ParamId, Delta>,
}

/// One projection's adapter, as read: `A` `[rank, in]`, `Bᵀ` `[rank, out]`.
struct Delta {
    a: Vec<f32>,
    b_t: Vec<f32>,
    rank: usize,
    scale: f32,
}

/// `base` with the adapters saved in `dir` merged into the projections of
/// `model` they target. Every tensor is checked first: each targeted
/// projection has both matrices at the file's rank, and the file holds
/// nothing else.
pub fn merged_values<B: Backend, M: LoraModel<B>, V: HostValues>(
    model: &M,
    base: V,
    dir: &Path,
) -> Result<MergedValues<V>, PeftError> {
    let config = read_adapter_config(&dir.join(ADAPTER_CONFIG))?;
    let (weights, bytes) = read_weights(dir)?;
    let file = parse_weights(&weights, &bytes)?;
    let (rank, mut wanted, mut deltas) = (config.rank, BTreeSet::new(), HashMap::new());
    for slot in model.slots() {
        if !config.targets.iter().any(|t| t.matches(&slot.path)) {
            continue;
        }
        let [d_in, d_out] = slot.base.weight.lazy_shape().dims();
        let (a_name, b_name) = (tensor_name(&slot.path, "A"), tensor_name(&slot.path, "B"));
        let a = tensor(&file, &weights, &a_name, vec![rank, d_in])?;
        let b = tensor(&file, &weights, &b_name, vec![d_out, rank])?;
        let b = b.as_slice::<f32>().expect("read as f32");
        let b_t = (0..rank * d_out)
            .map(|j| b[(j % d_out) * rank + j / d_out])
            .collect();
        deltas.insert(
            slot.base.weight.id,
            Delta {
                a: a.to_vec().expect("read as f32"),
                b_t,
                rank,
                scale: config.scale() as f32,
            },
        );
        wanted.extend([a_name, b_name]);
    }
    only_wanted(&file, weights, &wanted)?;
    Ok(MergedValues { base, deltas })
}

impl<V: HostValues> HostValues for MergedValues<V> {
    fn holds(&self, id: ParamId) -> bool {
        self.base.holds(id)
    }

    fn read(&self, id: ParamId, out: &mut [f32]) {
        self.base.read(id, out);
        let Some(delta) = self.deltas.get(&id) else {
            return;
        };
        let d_out = delta.b_t.len() / delta.rank;
        let d_in = delta.a.len() / delta.rank;
        // Row i of W (burn's [in, out]) gains Σ_k scale·A[k][i]·Bᵀ[k].
        out.par_chunks_mut(d_out).enumerate().for_each(|(i, row)| {
            for k in 0..delta.rank {
                let c = delta.scale * delta.a[k * d_in + i];
                let b = &delta.b_t[k * d_out..(k + 1) * d_out];
                for (w, b) in row.iter_mut().zip(b) {
                    *w += c * b;
                }
            }
        });
    }
}
