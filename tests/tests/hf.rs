//! Hugging Face checkpoints: parity with `transformers` on the committed
//! fixtures (tests/fixtures/generate.py), round trips, and bad checkpoints.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::TensorData;
use burn_offload::{BlockModel, Engine, EngineConfig};
use burn_offload_tests::{TestAutodiff as AD, TestBackend as B};
use models::hf::{self, HfError};
use models::{cross_entropy, Gpt2, Llama, ModelConfig};
use safetensors::SafeTensors;

const TOL: f64 = 1e-4;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The values `transformers` recorded for the fixtures in `dir`.
pub fn expected(dir: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, t)| {
            let values = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, (t.shape().to_vec(), values))
        })
        .collect()
}

/// The input ids the fixtures in `dir` were recorded on.
pub fn input_ids(dir: &Path) -> Tensor<AD, 2, Int> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("inputs.json")).unwrap()).unwrap();
    let rows: Vec<Vec<i64>> = serde_json::from_value(json["input_ids"].clone()).unwrap();
    let (b, t) = (rows.len(), rows[0].len());
    Tensor::from_data(TensorData::new(rows.concat(), [b, t]), &Default::default())
}

pub fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    d.sqrt() / n.sqrt().max(1e-30)
}

/// Our gradients by HF name, in HF layout.
struct Grads<'a> {
    config: &'a ModelConfig,
    grads: &'a <AD as burn::tensor::backend::AutodiffBackend>::Gradients,
    path: Vec<String>,
    out: HashMap<String, Vec<f32>>,
}

impl ModuleVisitor<AD> for Grads<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.into());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AD, D>>) {
        let (name, transpose) = hf::hf_name(self.config, &self.path.join("."));
        let g = param.val().grad(self.grads).unwrap();
        let g = if transpose { g.transpose() } else { g };
        self.out
            .insert(name, g.into_data().to_vec::<f32>().unwrap());
    }
}

/// Compares logits, loss and gradients with what `transformers` recorded in
/// `dir` under `prefix`; returns how many gradients were compared.
fn check_parity<M: BlockModel<AD> + AutodiffModule<AD>>(
    model: M,
    config: &ModelConfig,
    dir: &Path,
    prefix: &str,
) -> usize {
    let want = expected(dir);
    let ids = input_ids(dir);
    let [b, t] = ids.dims();
    let logits = model.forward(ids.clone());
    let (_, want_logits) = &want[&format!("{prefix}.logits")];
    let err = rel(
        &logits.clone().into_data().to_vec::<f32>().unwrap(),
        want_logits,
    );
    assert!(err <= TOL, "{prefix} logits: relative error {err}");

    // One training step's loss (labels = inputs, shifted) and gradients.
    let loss = cross_entropy(logits.narrow(1, 0, t - 1), ids.narrow(1, 1, t - 1));
    let loss_value = loss.clone().into_scalar();
    let want_loss = want[&format!("{prefix}.loss")].1[0];
    assert!(
        ((loss_value - want_loss) / want_loss).abs() as f64 <= TOL,
        "{prefix} loss {loss_value} vs {want_loss}"
    );
    let _ = b;
    let grads = loss.backward();
    let mut ours = Grads {
        config,
        grads: &grads,
        path: Vec::new(),
        out: HashMap::new(),
    };
    model.visit(&mut ours);
    let mut checked = 0;
    for (key, (_, want_grad)) in &want {
        let Some(name) = key.strip_prefix(&format!("{prefix}.grad.")) else {
            continue;
        };
        let err = rel(&ours.out[name], want_grad);
        assert!(
            err <= TOL,
            "{prefix} gradient of {name}: relative error {err}"
        );
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} gradients compared");
    checked
}

#[test]
fn llama_reproduces_transformers_logits_loss_and_gradients() {
    let dir = fixtures().join("llama-tiny");
    let config = hf::load_config(&dir).unwrap();
    let ModelConfig::Llama(c) = &config else {
        panic!("llama config expected")
    };
    let model: Llama<AD> =
        hf::load_weights(c.init::<AD>(&Default::default()), &config, &dir).unwrap();
    check_parity(model, &config, &fixtures(), "llama");
}

#[test]
fn gpt2_reproduces_transformers_logits_loss_and_gradients_from_shards() {
    let dir = fixtures().join("gpt2-tiny");
    assert!(
        dir.join("model.safetensors.index.json").exists(),
        "the GPT-2 fixture is sharded"
    );
    let config = hf::load_config(&dir).unwrap();
    let ModelConfig::Gpt2(c) = &config else {
        panic!("gpt2 config expected")
    };
    let model: Gpt2<AD> =
        hf::load_weights(c.init::<AD>(&Default::default()), &config, &dir).unwrap();
    check_parity(model, &config, &fixtures(), "gpt2");
}

/// All parameter values in visit order, as bits.
struct Bits(Vec<Vec<u32>>);
impl<BB: Backend> ModuleVisitor<BB> for Bits {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<BB, D>>) {
        self.0.push(
            param
                .val()
                .into_data()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect(),
        );
    }
}

fn bits<M: Module<B>>(m: &M) -> Vec<Vec<u32>> {
    let mut b = Bits(Vec::new());
    m.visit(&mut b);
    b.0
}

fn load_llama(dir: &Path) -> Result<Llama<B>, HfError> {
    let config = hf::load_config(dir)?;
    let ModelConfig::Llama(c) = &config else {
        panic!("llama config expected")
    };
    hf::load_weights(c.init::<B>(&Default::default()), &config, dir)
}

/// Loading reads no tensor onto the device: each parameter reads its
/// tensor when first used (the offload engine takes them one at a time into
/// its host store), with the checkpoint's values.
#[test]
fn loaded_weights_stay_on_the_host_until_used() {
    struct Initialised(Vec<bool>);
    impl ModuleVisitor<B> for Initialised {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.is_initialized());
        }
    }
    let dir = fixtures().join("families/llama3");
    let model = load_llama(&dir).unwrap();
    let mut before = Initialised(Vec::new());
    model.visit(&mut before);
    assert!(
        !before.0.is_empty() && before.0.iter().all(|i| !i),
        "{:?}",
        before.0
    );
    let embedding: Vec<f32> = model
        .embed_tokens
        .weight
        .val()
        .into_data()
        .to_vec()
        .unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let stored = SafeTensors::deserialize(&bytes).unwrap();
    let want: Vec<f32> = stored
        .tensor("model.embed_tokens.weight")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(embedding, want);
    let mut after = Initialised(Vec::new());
    model.visit(&mut after);
    assert_eq!(after.0.iter().filter(|i| **i).count(), 1);
}

/// An engine takes a checkpoint's tensors from its files
/// (`Engine::with_host_values`): no parameter is drawn on the device (each
/// panics if it is), and the model it holds gives transformers' logits.
#[test]
fn an_engine_takes_checkpoint_tensors_without_drawing_them() {
    struct NeverDrawn;
    impl ModuleMapper<B> for NeverDrawn {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (shape, device) = (param.lazy_shape(), param.lazy_device());
            let draw = |_: &burn::tensor::Device<B>, _: bool| -> Tensor<B, D> {
                panic!("a parameter was drawn")
            };
            Param::uninitialized(param.id, draw, device, true, shape)
        }
    }
    let root = fixtures().join("families");
    let dir = root.join("llama3");
    let config = hf::load_config(&dir).unwrap();
    let ModelConfig::Llama(c) = &config else {
        panic!("llama config expected")
    };
    let device = Default::default();
    let (model, values) = hf::load_weights_for_store(c.init::<B>(&device), &config, &dir).unwrap();
    let model = model.map(&mut NeverDrawn);
    let mut engine =
        Engine::with_host_values(model, &values, None, EngineConfig::default(), &[device]).unwrap();
    let logits = engine.model().forward(input_ids(&root).inner());
    let want = expected(&root);
    let err = rel(
        &logits.into_data().to_vec::<f32>().unwrap(),
        &want["llama3.logits"].1,
    );
    assert!(err <= TOL, "logits: relative error {err}");
}

#[test]
fn import_export_import_is_exact() {
    let out = tempfile::tempdir().unwrap();
    let families = ["llama3", "mistral", "qwen2", "qwen3"].map(|f| format!("families/{f}"));
    for name in ["llama-tiny", "gpt2-tiny"]
        .map(String::from)
        .iter()
        .chain(&families)
    {
        let dir = fixtures().join(name);
        let config = hf::load_config(&dir).unwrap();
        let target = out.path().join(name);
        let (first, second) = match &config {
            ModelConfig::Llama(c) => {
                let m: Llama<B> =
                    hf::load_weights(c.init(&Default::default()), &config, &dir).unwrap();
                hf::save(&m, &config, &target).unwrap();
                let again: Llama<B> =
                    hf::load_weights(c.init(&Default::default()), &config, &target).unwrap();
                (bits(&m), bits(&again))
            }
            ModelConfig::Gpt2(c) => {
                let m: Gpt2<B> =
                    hf::load_weights(c.init(&Default::default()), &config, &dir).unwrap();
                hf::save(&m, &config, &target).unwrap();
                let again: Gpt2<B> =
                    hf::load_weights(c.init(&Default::default()), &config, &target).unwrap();
                (bits(&m), bits(&again))
            }
        };
        assert_eq!(
            hf::load_config(&target).unwrap(),
            config,
            "{name}: config round trip"
        );
        assert!(
            first == second,
            "{name}: parameters changed in the round trip"
        );
    }
}

#[test]
fn bf16_checkpoints_are_upcast_exactly() {
    let f32_model = load_llama(&fixtures().join("llama-tiny")).unwrap();
    let bf16_model = load_llama(&fixtures().join("llama-tiny-bf16")).unwrap();
    let round = |v: &Vec<Vec<u32>>| -> Vec<Vec<u32>> {
        v.iter()
            .map(|t| {
                t.iter()
                    .map(|b| {
                        burn::tensor::bf16::from_f32(f32::from_bits(*b))
                            .to_f32()
                            .to_bits()
                    })
                    .collect()
            })
            .collect()
    };
    assert!(
        round(&bits(&f32_model)) == bits(&bf16_model),
        "bf16 import differs from f32 weights rounded to bf16"
    );
}

/// A copy of the Llama fixture whose safetensors file is rewritten by `edit`.
fn damaged(
    edit: impl FnOnce(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures().join("llama-tiny");
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    edit(&mut tensors);
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

fn error_of(dir: &Path) -> String {
    load_llama(dir).expect_err("loading must fail").to_string()
}

#[test]
fn missing_tensor_is_a_clear_error() {
    let dir = damaged(|t| t.retain(|(n, ..)| n != "model.layers.1.mlp.up_proj.weight"));
    let err = error_of(dir.path());
    assert!(
        err.contains("has no tensor `model.layers.1.mlp.up_proj.weight`"),
        "{err}"
    );
}

#[test]
fn wrong_shape_is_a_clear_error() {
    let dir = damaged(|t| {
        let norm = t
            .iter_mut()
            .find(|(n, ..)| n == "model.norm.weight")
            .unwrap();
        norm.2 = vec![32];
        norm.3.truncate(32 * 4);
    });
    let err = error_of(dir.path());
    assert!(
        err.contains("tensor `model.norm.weight` has shape [32], the model expects [64]"),
        "{err}"
    );
}

#[test]
fn unsupported_dtype_is_a_clear_error() {
    let dir = damaged(|t| {
        let norm = t
            .iter_mut()
            .find(|(n, ..)| n == "model.norm.weight")
            .unwrap();
        norm.1 = safetensors::Dtype::I32;
    });
    let err = error_of(dir.path());
    assert!(
        err.contains("tensor `model.norm.weight` has dtype I32; supported: F32, BF16, F16"),
        "{err}"
    );
}

#[test]
fn truncated_file_is_a_clear_error() {
    let dir = damaged(|_| {});
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    let err = error_of(dir.path());
    assert!(
        err.contains("model.safetensors` is truncated or corrupted"),
        "{err}"
    );
}

#[test]
fn unsupported_architecture_is_a_clear_error() {
    let dir = damaged(|_| {});
    let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        config.replace("\"llama\"", "\"bert\""),
    )
    .unwrap();
    let err = hf::load_config(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains(
            "unsupported architecture `bert` (supported: llama, mistral, qwen2, qwen3, gpt2)"
        ),
        "{err}"
    );
    std::fs::write(
        dir.path().join("config.json"),
        config.replace("\"silu\"", "\"gelu\""),
    )
    .unwrap();
    let err = hf::load_config(dir.path()).unwrap_err().to_string();
    assert!(err.contains("unsupported hidden_act `gelu`"), "{err}");
}

#[test]
fn train_fine_tunes_from_an_hf_checkpoint_and_exports_one() {
    use trainer::options::TrainOptions;
    use trainer::run::run;
    let out = tempfile::tempdir().unwrap();
    let families = ["llama3", "mistral", "qwen2", "qwen3"].map(|f| format!("families/{f}"));
    for name in ["llama-tiny", "gpt2-tiny"]
        .map(String::from)
        .iter()
        .chain(&families)
    {
        let export = out.path().join(name);
        let report = run(&TrainOptions {
            init_from: Some(fixtures().join(name)),
            export_hf: Some(export.clone()),
            steps: 1,
            batch: 2,
            seq_len: 16,
            // So small that the exported weights must equal the imported ones.
            lr: Some(1e-12),
            warmup: 1,
            sample_tokens: 2,
            ..TrainOptions::default()
        })
        .unwrap();
        assert_eq!(
            report.config,
            hf::load_config(&fixtures().join(name)).unwrap()
        );
        // The fixtures' random weights give a loss far from a fresh init's ln(256).
        assert!(report.losses[0].is_finite());
        let config = hf::load_config(&export).unwrap();
        let (a, b) = match &config {
            ModelConfig::Llama(c) => (
                bits(
                    &hf::load_weights::<B, Llama<B>>(c.init(&Default::default()), &config, &export)
                        .unwrap(),
                ),
                bits(
                    &hf::load_weights::<B, Llama<B>>(
                        c.init(&Default::default()),
                        &config,
                        &fixtures().join(name),
                    )
                    .unwrap(),
                ),
            ),
            ModelConfig::Gpt2(c) => (
                bits(
                    &hf::load_weights::<B, Gpt2<B>>(c.init(&Default::default()), &config, &export)
                        .unwrap(),
                ),
                bits(
                    &hf::load_weights::<B, Gpt2<B>>(
                        c.init(&Default::default()),
                        &config,
                        &fixtures().join(name),
                    )
                    .unwrap(),
                ),
            ),
        };
        let to_f32 = |v: &Vec<Vec<u32>>| {
            v.iter()
                .flatten()
                .map(|b| f32::from_bits(*b))
                .collect::<Vec<_>>()
        };
        let err = rel(&to_f32(&a), &to_f32(&b));
        assert!(
            err < 1e-6,
            "{name}: exported weights differ from the imported ones by {err}"
        );
    }
}

/// Llama 3.x (scaled rope past the original context, 12-wide heads, biases,
/// a 3000-token vocabulary with an untied head), Mistral, Qwen2 (q/k/v
/// biases, tied head) and Qwen3 (per-head query/key norms, head_dim apart
/// from hidden_size / heads, tied head) against `transformers`: logits, loss
/// and the gradient of every parameter (tests/fixtures/families.py).
#[test]
fn every_family_reproduces_transformers_logits_loss_and_all_gradients() {
    let root = fixtures().join("families");
    for name in ["llama3", "mistral", "qwen2", "qwen3"] {
        let dir = root.join(name);
        let config = hf::load_config(&dir).unwrap();
        let ModelConfig::Llama(c) = &config else {
            panic!("{name}: a Llama-shaped config expected")
        };
        let model: Llama<AD> =
            hf::load_weights(c.init::<AD>(&Default::default()), &config, &dir).unwrap();
        let params = tensor_count(&model);
        let checked = check_parity(model, &config, &root, name);
        assert_eq!(checked, params, "{name}: not every gradient was compared");
    }
}

/// Float parameter tensors of `model`.
fn tensor_count<M: Module<AD>>(model: &M) -> usize {
    struct Count(usize);
    impl ModuleVisitor<AD> for Count {
        fn visit_float<const D: usize>(&mut self, _: &Param<Tensor<AD, D>>) {
            self.0 += 1;
        }
    }
    let mut count = Count(0);
    model.visit(&mut count);
    count.0
}

/// A family's fixture config with `edit` applied, in a folder of its own.
fn edited_config(family: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures().join("families").join(family).join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

#[test]
fn unsupported_family_options_are_clear_errors() {
    let err_of = |family: &str, edit: fn(&mut serde_json::Value)| {
        hf::load_config(edited_config(family, edit).path())
            .unwrap_err()
            .to_string()
    };
    let err = err_of("llama3", |c| {
        c["rope_parameters"]["rope_type"] = "yarn".into();
    });
    assert!(
        err.contains("unsupported rope scaling `yarn` (supported: default, linear, llama3)"),
        "{err}"
    );
    let err = err_of("llama3", |c| {
        c["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("low_freq_factor");
    });
    assert!(err.contains("without a numeric `low_freq_factor`"), "{err}");
    let err = err_of("qwen2", |c| c["use_sliding_window"] = true.into());
    assert!(
        err.contains("unsupported `use_sliding_window: true`"),
        "{err}"
    );
    let err = err_of("llama3", |c| {
        c["quantization_config"] =
            serde_json::json!({"quant_method": "bitsandbytes", "load_in_4bit": true});
    });
    assert!(
        err.contains(
            "unsupported pre-quantised weights (`quantization_config`: bitsandbytes 4-bit)"
        ),
        "{err}"
    );
    let err = err_of("qwen3", |c| c["mlp_bias"] = true.into());
    assert!(
        err.contains("unsupported `mlp_bias: true` for qwen3"),
        "{err}"
    );
}

/// Checkpoints written before transformers 5 name the scaling `rope_scaling`
/// (with `rope_theta` beside it): read the same as `rope_parameters`.
#[test]
fn rope_scaling_is_read_from_either_key() {
    let dir = fixtures().join("families").join("llama3");
    let modern = hf::load_config(&dir).unwrap();
    let legacy = edited_config("llama3", |c| {
        let mut rope = c["rope_parameters"].take();
        c["rope_theta"] = rope["rope_theta"].take();
        rope.as_object_mut().unwrap().remove("rope_theta");
        c["rope_scaling"] = rope;
        c.as_object_mut().unwrap().remove("rope_parameters");
    });
    assert_eq!(hf::load_config(legacy.path()).unwrap(), modern);
    let ModelConfig::Llama(c) = modern else {
        panic!()
    };
    assert!(c.rope_scaling.is_some() && c.rope_theta == 500_000.0);
}
