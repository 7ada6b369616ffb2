//! Hugging Face checkpoints in and out: `config.json` plus `model.safetensors`
//! (or shards listed in `model.safetensors.index.json`), for Llama-family
//! models and GPT-2.
//!
//! Files are memory-mapped and copied tensor by tensor into the model's
//! parameters; on `Offload<B>` those are host-resident, so a checkpoint loads
//! without touching the GPU. Names are mapped from our module paths
//! (`layers.0.attn.q_proj.weight`) to HF's (`model.layers.0.self_attn.q_proj.weight`).
//! HF `nn.Linear` stores `[out, in]` and burn `[in, out]`, so Llama
//! projections are transposed; GPT-2's `Conv1D` already stores `[in, out]`.
//! bf16 and f16 tensors are upcast to f32; other dtypes are refused.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, bf16, f16, Tensor, TensorData};
use rayon::prelude::*;
use safetensors::tensor::{Dtype, SafeTensors, TensorView, View};
use serde_json::{json, Value};

use crate::llama::{AttentionBias, Family, RopeScaling};
use crate::{Gpt2Config, LlamaConfig, ModelConfig};

mod weights;
pub use weights::{load_weights, load_weights_for_store, CheckpointValues};

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    // The OS error is part of the message rather than a `source`, so that
    // error-chain printers do not repeat it.
    #[error("`{}`: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("`{path}`: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("`{path}`: unsupported {what}")]
    Unsupported { path: PathBuf, what: String },
    #[error("`{path}` is truncated or corrupted: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("checkpoint `{dir}` has no tensor `{name}`")]
    MissingTensor { dir: PathBuf, name: String },
    #[error("tensor `{name}` has shape {got:?}, the model expects {want:?}")]
    Shape {
        name: String,
        got: Vec<usize>,
        want: Vec<usize>,
    },
    #[error("tensor `{name}` has dtype {dtype}; supported: F32, BF16, F16")]
    Dtype { name: String, dtype: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HfError + '_ {
    move |error| HfError::Io {
        path: path.to_path_buf(),
        error,
    }
}

pub fn read_json(path: &Path) -> Result<Value, HfError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    serde_json::from_str(text).map_err(|e| HfError::Config {
        path: path.into(),
        reason: format!("invalid JSON: {e}"),
    })
}

/// A `config.json`'s fields, null ones counting as absent.
struct Fields<'a> {
    json: &'a Value,
    path: &'a Path,
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.json.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str) -> Result<usize, HfError> {
        self.get(key)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| HfError::Config {
                path: self.path.to_path_buf(),
                reason: format!("missing or non-integer `{key}`"),
            })
    }

    fn flag(&self, key: &str) -> bool {
        self.get(key).and_then(Value::as_bool).unwrap_or(false)
    }

    fn unsupported(&self, what: String) -> HfError {
        HfError::Unsupported {
            path: self.path.to_path_buf(),
            what,
        }
    }
}

/// Reads `config.json` into one of our model configs.
pub fn load_config(dir: &Path) -> Result<ModelConfig, HfError> {
    let path = dir.join("config.json");
    let json = read_json(&path)?;
    let fields = Fields {
        json: &json,
        path: &path,
    };
    let field = |k: &str| fields.get(k);
    let usize_of = |k: &str| fields.usize(k);
    let unsupported = |what: String| fields.unsupported(what);
    let model_type = field("model_type")
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    if let Some(quantization) = field("quantization_config") {
        return Err(unsupported(pre_quantised(quantization)));
    }
    let config = match model_type {
        "llama" | "mistral" | "qwen2" | "qwen3" => {
            ModelConfig::Llama(llama_config(model_type, &fields)?)
        }
        "gpt2" => {
            let act = field("activation_function")
                .and_then(Value::as_str)
                .unwrap_or("gelu_new");
            if !matches!(act, "gelu_new" | "gelu_pytorch_tanh") {
                return Err(unsupported(format!(
                    "activation_function `{act}` (GPT-2 here uses gelu_new)"
                )));
            }
            let d_model = usize_of("n_embd")?;
            if field("n_inner")
                .and_then(Value::as_u64)
                .is_some_and(|n| n as usize != 4 * d_model)
            {
                return Err(unsupported("n_inner other than 4 × n_embd".into()));
            }
            for flag in ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"] {
                if field(flag).and_then(Value::as_bool) == Some(true) {
                    return Err(unsupported(format!("`{flag}: true`")));
                }
            }
            ModelConfig::Gpt2(Gpt2Config {
                vocab_size: usize_of("vocab_size")?,
                n_ctx: usize_of("n_positions")?,
                d_model,
                n_layer: usize_of("n_layer")?,
                n_head: usize_of("n_head")?,
                layer_norm_eps: field("layer_norm_epsilon")
                    .and_then(Value::as_f64)
                    .unwrap_or(1e-5),
            })
        }
        other => {
            return Err(unsupported(format!(
                "architecture `{other}` (supported: llama, mistral, qwen2, qwen3, gpt2)"
            )))
        }
    };
    config.validate().map_err(|e| HfError::Config {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    Ok(config)
}

/// What a pre-quantised checkpoint's `quantization_config` says it is. Its
/// weights are codes in the quantiser's own layout: they cannot be read as
/// values, and re-quantising them (`--base-dtype`) would quantise twice.
fn pre_quantised(quantization: &Value) -> String {
    let method = quantization
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let bits = quantization
        .get("bits")
        .and_then(Value::as_u64)
        .or_else(|| {
            let flag = |k: &str| quantization.get(k).and_then(Value::as_bool) == Some(true);
            (flag("load_in_4bit").then_some(4)).or(flag("load_in_8bit").then_some(8))
        })
        .map(|b| format!(" {b}-bit"))
        .unwrap_or_default();
    format!(
        "pre-quantised weights (`quantization_config`: {method}{bits}); give the \
         full-precision checkpoint (`--base-dtype int8|nf4` quantises a LoRA base while loading)"
    )
}

/// The Llama-shaped families' `config.json` (`model_type` one of llama,
/// mistral, qwen2, qwen3): what differs between them is which fields apply.
fn llama_config(model_type: &str, fields: &Fields) -> Result<LlamaConfig, HfError> {
    let field = |k: &str| fields.get(k);
    let usize_of = |k: &str| fields.usize(k);
    let unsupported = |what: String| fields.unsupported(what);
    let flag = |k: &str| fields.flag(k);
    let family = match model_type {
        "mistral" => Family::Mistral,
        "qwen2" => Family::Qwen2,
        "qwen3" => Family::Qwen3,
        _ => Family::Llama,
    };
    if let Some(act) = field("hidden_act").and_then(Value::as_str) {
        if act != "silu" {
            return Err(unsupported(format!(
                "hidden_act `{act}` ({model_type} here uses silu)"
            )));
        }
    }
    let attention_bias = match family {
        // Qwen2's q, k and v projections always carry a bias, o never.
        Family::Qwen2 => AttentionBias::Qkv,
        Family::Mistral => AttentionBias::None,
        Family::Llama | Family::Qwen3 if flag("attention_bias") => AttentionBias::All,
        Family::Llama | Family::Qwen3 => AttentionBias::None,
    };
    if family != Family::Llama && flag("mlp_bias") {
        return Err(unsupported(format!("`mlp_bias: true` for {model_type}")));
    }
    // transformers 5 writes `rope_parameters` (with rope_theta inside);
    // checkpoints from before write `rope_scaling` and `rope_theta`.
    let rope = field("rope_parameters").or(field("rope_scaling"));
    let number = |k: &str| -> Result<f64, HfError> {
        rope.and_then(|r| r.get(k))
            .and_then(Value::as_f64)
            .ok_or_else(|| unsupported(format!("rope scaling without a numeric `{k}`")))
    };
    let rope_type = rope
        .and_then(|r| r.get("rope_type").or(r.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let rope_scaling = match rope_type {
        "default" => None,
        "linear" => Some(RopeScaling::Linear {
            factor: number("factor")?,
        }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_max_position_embeddings: number("original_max_position_embeddings")? as usize,
        }),
        other => {
            return Err(unsupported(format!(
                "rope scaling `{other}` (supported: default, linear, llama3)"
            )))
        }
    };
    let theta = rope
        .and_then(|r| r.get("rope_theta"))
        .or(field("rope_theta"))
        .and_then(Value::as_f64)
        .unwrap_or(10_000.0);
    let sliding_window = match family {
        Family::Mistral => field("sliding_window").and_then(Value::as_u64),
        // Qwen's window applies only with `use_sliding_window`, and then to
        // some layers only: not implemented.
        Family::Qwen2 | Family::Qwen3 if flag("use_sliding_window") => {
            return Err(unsupported("`use_sliding_window: true`".into()))
        }
        _ => None,
    };
    let heads = usize_of("num_attention_heads")?;
    let d_model = usize_of("hidden_size")?;
    // An explicit head_dim equal to the default is kept implicit, so that
    // configs compare equal whether or not the file spelled it out.
    let head_dim = field("head_dim")
        .and_then(Value::as_u64)
        .map(|h| h as usize)
        .filter(|&h| h * heads != d_model);
    Ok(LlamaConfig {
        vocab_size: usize_of("vocab_size")?,
        d_model,
        n_layer: usize_of("num_hidden_layers")?,
        n_head: heads,
        n_kv_head: field("num_key_value_heads")
            .and_then(Value::as_u64)
            .map_or(heads, |v| v as usize),
        d_ff: usize_of("intermediate_size")?,
        rope_theta: theta,
        rms_norm_eps: field("rms_norm_eps")
            .and_then(Value::as_f64)
            .unwrap_or(1e-6),
        max_seq_len: field("max_position_embeddings")
            .and_then(Value::as_u64)
            .map_or(4096, |v| v as usize),
        head_dim,
        rope_scaling,
        attention_bias,
        mlp_bias: flag("mlp_bias"),
        qk_norm: family == Family::Qwen3,
        tie_embeddings: flag("tie_word_embeddings"),
        sliding_window: sliding_window.map(|w| w as usize),
        family,
    })
}

/// HF tensor name and whether the tensor is stored transposed relative to burn.
pub fn hf_name(config: &ModelConfig, ours: &str) -> (String, bool) {
    let field = |s: &str| s.replace(".gamma", ".weight").replace(".beta", ".bias");
    match config {
        ModelConfig::Llama(_) => {
            let name = match ours {
                "lm_head.weight" => return ("lm_head.weight".into(), true),
                "embed_tokens.weight" => "model.embed_tokens.weight".into(),
                "norm.gamma" => "model.norm.weight".into(),
                layer => format!("model.{}", field(&layer.replace(".attn.", ".self_attn."))),
            };
            let transpose = name.ends_with("_proj.weight");
            (name, transpose)
        }
        ModelConfig::Gpt2(_) => {
            let name = match ours.strip_prefix("blocks.") {
                Some(rest) => format!("transformer.h.{}", field(rest)),
                None => format!("transformer.{}", field(ours)),
            };
            (name, false)
        }
    }
}

/// The safetensors files of a checkpoint, memory-mapped.
pub struct Checkpoint {
    dir: PathBuf,
    /// HF tensor name → index into `files`.
    index: HashMap<String, usize>,
    files: Vec<(PathBuf, memmap2::Mmap)>,
}

impl Checkpoint {
    /// Opens `model.safetensors`, or the shards named by `model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self, HfError> {
        let index_path = dir.join("model.safetensors.index.json");
        let names: Vec<PathBuf> = if index_path.is_file() {
            let index = read_json(&index_path)?;
            let map = index
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| HfError::Config {
                    path: index_path.clone(),
                    reason: "no `weight_map` object".into(),
                })?;
            let mut files: Vec<String> = map
                .values()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect();
            files.sort();
            files.dedup();
            files.into_iter().map(|f| dir.join(f)).collect()
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut checkpoint = Self {
            dir: dir.to_path_buf(),
            index: HashMap::new(),
            files: Vec::new(),
        };
        for path in names {
            let file = File::open(&path).map_err(io(&path))?;
            // SAFETY: read-only mapping of a checkpoint nobody writes while we load.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(&path))?;
            let st = SafeTensors::deserialize(&map).map_err(|e| HfError::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            for name in st.names() {
                checkpoint
                    .index
                    .insert(name.to_string(), checkpoint.files.len());
            }
            checkpoint.files.push((path, map));
        }
        Ok(checkpoint)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Each weight file's path and bytes (memory-mapped).
    pub fn files(&self) -> impl Iterator<Item = (&Path, &[u8])> {
        self.files
            .iter()
            .map(|(path, map)| (path.as_path(), &map[..]))
    }

    /// The stored name of our parameter `ours` ([`hf_name`]), and whether it
    /// is stored transposed, where the file names it otherwise: an untied
    /// head read from a checkpoint that ties it, GPT-2 files without the
    /// `transformer.` prefix.
    pub(crate) fn name_of(&self, config: &ModelConfig, ours: &str) -> (String, bool) {
        let (name, transpose) = hf_name(config, ours);
        if !self.contains(&name) {
            if ours == "lm_head.weight" && self.contains("model.embed_tokens.weight") {
                return ("model.embed_tokens.weight".into(), transpose);
            }
            if let Some(bare) = name
                .strip_prefix("transformer.")
                .filter(|b| self.contains(b))
            {
                return (bare.to_string(), transpose);
            }
        }
        (name, transpose)
    }

    /// The stored tensor `name`, checked against burn's `shape` (transposed
    /// for tensors stored `[out, in]`) and for a dtype we read.
    pub(crate) fn view(
        &self,
        name: &str,
        shape: &[usize],
        transpose: bool,
    ) -> Result<TensorView<'_>, HfError> {
        let missing = || HfError::MissingTensor {
            dir: self.dir.clone(),
            name: name.to_string(),
        };
        let file = *self.index.get(name).ok_or_else(missing)?;
        let (path, map) = &self.files[file];
        let st = SafeTensors::deserialize(map).map_err(|e| HfError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let t = st.tensor(name).map_err(|_| missing())?;
        let stored: Vec<usize> = if transpose {
            shape.iter().rev().copied().collect()
        } else {
            shape.to_vec()
        };
        if t.shape() != stored {
            return Err(HfError::Shape {
                name: name.into(),
                got: t.shape().to_vec(),
                want: stored,
            });
        }
        if !matches!(t.dtype(), Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            return Err(HfError::Dtype {
                name: name.into(),
                dtype: format!("{:?}", t.dtype()),
            });
        }
        Ok(t)
    }

    /// A tensor as f32 in burn's layout (`shape` is burn's), transposing 2-D
    /// tensors stored `[out, in]`.
    pub(crate) fn read(
        &self,
        name: &str,
        shape: &[usize],
        transpose: bool,
    ) -> Result<TensorData, HfError> {
        let mut values = vec![0.0f32; shape.iter().product()];
        self.read_into(name, shape, transpose, &mut values)?;
        Ok(TensorData::new(values, shape.to_vec()))
    }

    /// [`Checkpoint::read`] into `out`, converted and transposed on every
    /// core (a 70B model is 280 GB of f32).
    pub(crate) fn read_into(
        &self,
        name: &str,
        shape: &[usize],
        transpose: bool,
        out: &mut [f32],
    ) -> Result<(), HfError> {
        let t = self.view(name, shape, transpose)?;
        let (bytes, dtype) = (t.data(), t.dtype());
        let width = stored_width(dtype).expect("view checked the dtype");
        let value = |i: usize| widen(dtype, &bytes[i * width..(i + 1) * width]);
        const ROWS: usize = 1 << 14;
        if transpose {
            // Stored [rows, cols]; out[c][r] = stored[r][c], a band of
            // output rows per task.
            let (rows, cols) = (t.shape()[0], t.shape()[1]);
            const BAND: usize = 16;
            out.par_chunks_mut(rows * BAND)
                .enumerate()
                .for_each(|(band, chunk)| {
                    let c0 = band * BAND;
                    for r in 0..rows {
                        for (k, o) in chunk.chunks_mut(rows).enumerate() {
                            o[r] = value(r * cols + c0 + k);
                        }
                    }
                });
        } else {
            out.par_chunks_mut(ROWS).enumerate().for_each(|(i, chunk)| {
                for (k, o) in chunk.iter_mut().enumerate() {
                    *o = value(i * ROWS + k);
                }
            });
        }
        Ok(())
    }
}

/// Checks, reading no weights, that the checkpoint in `dir` holds every
/// parameter of `model` (lazily initialised: nothing is drawn) with its shape
/// and a dtype we read, so a run can refuse it before it writes anything.
pub fn check_weights<B: Backend, M: Module<B>>(
    model: &M,
    config: &ModelConfig,
    dir: &Path,
) -> Result<(), HfError> {
    check_all(model, config, &Checkpoint::open(dir)?)
}

/// [`check_weights`] against an open checkpoint: the first parameter it
/// lacks, or holds with another shape or a dtype we do not read.
pub(crate) fn check_all<B: Backend, M: Module<B>>(
    model: &M,
    config: &ModelConfig,
    checkpoint: &Checkpoint,
) -> Result<(), HfError> {
    struct Check<'a> {
        checkpoint: &'a Checkpoint,
        config: &'a ModelConfig,
        path: Vec<String>,
        error: Option<HfError>,
    }
    impl<B: Backend> ModuleVisitor<B> for Check<'_> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.error.is_none() {
                let (name, transpose) = self.checkpoint.name_of(self.config, &self.path.join("."));
                let shape = param.lazy_shape().to_vec();
                self.error = self.checkpoint.view(&name, &shape, transpose).err();
            }
        }
    }
    let mut check = Check {
        checkpoint,
        config,
        path: Vec::new(),
        error: None,
    };
    model.visit(&mut check);
    check.error.map_or(Ok(()), Err)
}

/// Every float parameter with its module path, as f32 in HF layout.
struct Gather<'a> {
    config: &'a ModelConfig,
    path: Vec<String>,
    out: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl<B: Backend> ModuleVisitor<B> for Gather<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let (name, transpose) = hf_name(self.config, &self.path.join("."));
        let tensor = if transpose {
            param.val().transpose()
        } else {
            param.val()
        };
        let shape = tensor.dims().to_vec();
        let values = tensor
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32 values");
        self.out.push((name, shape, values));
    }
}

struct Owned<'a>(&'a [usize], &'a [f32]);

impl View for Owned<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        self.0
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        self.1
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into()
    }
    fn data_len(&self) -> usize {
        self.1.len() * 4
    }
}

/// HF `config.json` for one of our configs.
pub fn hf_config(config: &ModelConfig) -> Value {
    match config {
        ModelConfig::Llama(c) => {
            let mut config = json!({
                "architectures": [c.family.architecture()],
                "model_type": c.family.model_type(),
                "vocab_size": c.vocab_size,
                "hidden_size": c.d_model,
                "intermediate_size": c.d_ff,
                "num_hidden_layers": c.n_layer,
                "num_attention_heads": c.n_head,
                "num_key_value_heads": c.n_kv_head,
                "head_dim": c.head_dim(),
                "max_position_embeddings": c.max_seq_len,
                "rms_norm_eps": c.rms_norm_eps,
                "rope_theta": c.rope_theta,
                "hidden_act": "silu",
                "tie_word_embeddings": c.tie_embeddings,
                "torch_dtype": "float32",
            });
            let fields = config.as_object_mut().expect("an object");
            match c.family {
                Family::Llama => {
                    fields.insert(
                        "attention_bias".into(),
                        (c.attention_bias == AttentionBias::All).into(),
                    );
                    fields.insert("mlp_bias".into(), c.mlp_bias.into());
                }
                Family::Qwen3 => {
                    fields.insert(
                        "attention_bias".into(),
                        (c.attention_bias == AttentionBias::All).into(),
                    );
                }
                Family::Mistral => {
                    fields.insert("sliding_window".into(), c.sliding_window.into());
                }
                Family::Qwen2 => {}
            }
            if let Some(scaling) = &c.rope_scaling {
                let mut rope = serde_json::to_value(scaling).expect("rope scaling serialises");
                rope["rope_theta"] = c.rope_theta.into();
                fields.insert("rope_scaling".into(), rope.clone());
                // transformers 5 reads `rope_parameters` first.
                fields.insert("rope_parameters".into(), rope);
            }
            config
        }
        ModelConfig::Gpt2(c) => json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": c.vocab_size,
            "n_positions": c.n_ctx,
            "n_embd": c.d_model,
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "layer_norm_epsilon": c.layer_norm_eps,
            "activation_function": "gelu_new",
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "tie_word_embeddings": true,
            "torch_dtype": "float32",
        }),
    }
}

/// Writes `model` as an HF checkpoint (`config.json`, `model.safetensors`, f32)
/// loadable by `transformers`.
pub fn save<B: Backend, M: Module<B>>(
    model: &M,
    config: &ModelConfig,
    dir: &Path,
) -> Result<(), HfError> {
    save_weights(model, config, dir)?;
    let config_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&hf_config(config)).expect("config serialises");
    std::fs::write(&config_path, text).map_err(io(&config_path))
}

/// Writes `model`'s weights under HF's names into `dir/model.safetensors`
/// (f32), creating `dir`.
pub fn save_weights<B: Backend, M: Module<B>>(
    model: &M,
    config: &ModelConfig,
    dir: &Path,
) -> Result<(), HfError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut gather = Gather {
        config,
        path: Vec::new(),
        out: Vec::new(),
    };
    model.visit(&mut gather);
    let views = gather
        .out
        .iter()
        .map(|(name, shape, values)| (name.clone(), Owned(shape, values)));
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, metadata, &path).map_err(|e| HfError::Io {
        path: path.clone(),
        error: std::io::Error::other(e.to_string()),
    })
}

/// A safetensors tensor's values widened to f32 (stored little-endian as
/// f32, bf16 or f16); `None` for any other dtype.
pub(crate) fn f32_values(t: &TensorView<'_>) -> Option<Vec<f32>> {
    let width = stored_width(t.dtype())?;
    Some(
        t.data()
            .chunks_exact(width)
            .map(|b| widen(t.dtype(), b))
            .collect(),
    )
}

/// Bytes of one stored value of `dtype`, for the dtypes widened to f32.
fn stored_width(dtype: Dtype) -> Option<usize> {
    match dtype {
        Dtype::F32 => Some(4),
        Dtype::BF16 | Dtype::F16 => Some(2),
        _ => None,
    }
}

/// One little-endian value of `dtype` (f32, bf16, else f16) as f32.
#[inline]
fn widen(dtype: Dtype, b: &[u8]) -> f32 {
    match dtype {
        Dtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        Dtype::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        _ => f16::from_le_bytes([b[0], b[1]]).to_f32(),
    }
}
