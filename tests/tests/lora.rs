//! LoRA adapters: the adapted forward is the forward of the
//! merged weights, only adapters learn, merging and PEFT's files round-trip,
//! and a model without adapters keeps its parameter names and order.

use std::collections::HashMap;
use std::path::Path;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Distribution;
use burn_offload::BlockModel;
use burn_offload_tests::{random_tokens, TestAutodiff as AD};
use models::llama::AttentionBias;
use models::lora::LoraModel;
use models::peft::{load_peft, save_peft, PeftDtype, PeftError, ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use models::{Gpt2Config, LlamaConfig, LoraConfig, LoraError, LoraTarget};
use safetensors::SafeTensors;
use serde_json::Value;

const TOL: f32 = 1e-5;

fn llama_config() -> LlamaConfig {
    // Four query heads over two key/value heads: grouped-query attention.
    let config = LlamaConfig {
        n_layer: 2,
        ..LlamaConfig::tiny()
    };
    assert!(config.n_kv_head < config.n_head);
    config
}

fn gpt2_config() -> Gpt2Config {
    Gpt2Config {
        n_layer: 2,
        ..Gpt2Config::tiny()
    }
}

fn all_llama_targets() -> Vec<LoraTarget> {
    [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    .iter()
    .map(|n| n.parse().unwrap())
    .collect()
}

fn llama_lora() -> LoraConfig {
    LoraConfig::new(4, 8.0, all_llama_targets())
}

fn gpt2_lora() -> LoraConfig {
    // `c_proj` is both of GPT-2's; rank-stabilised scaling.
    let targets = ["c_attn", "c_proj", "c_fc"].map(|n| n.parse().unwrap());
    LoraConfig {
        rslora: true,
        ..LoraConfig::new(3, 6.0, targets.to_vec())
    }
}

/// Initialises every lazy parameter: a clone of a lazy parameter draws
/// its own values, and the tests compare clones.
fn realised<M: Module<AD>>(model: M) -> M {
    struct Realise;
    impl<B: Backend> ModuleMapper<B> for Realise {
        fn map_float<const D: usize>(&mut self, p: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            p.map(|t| t)
        }
    }
    model.map(&mut Realise)
}

/// Module paths of every float parameter, in visit order.
fn names<B: Backend, M: Module<B>>(model: &M) -> Vec<String> {
    struct Names(Vec<String>, Vec<String>);
    impl<B: Backend> ModuleVisitor<B> for Names {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.1.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.1.pop();
        }
        fn visit_float<const D: usize>(&mut self, _: &Param<Tensor<B, D>>) {
            self.0.push(self.1.join("."));
        }
    }
    let mut v = Names(Vec::new(), Vec::new());
    model.visit(&mut v);
    v.0
}

/// Every float parameter's values by module path, and whether the
/// gradients hold one for it.
fn params<M: Module<AD>>(
    model: &M,
    grads: Option<&<AD as AutodiffBackend>::Gradients>,
) -> Vec<(String, Vec<f32>, bool)> {
    struct Values<'a> {
        path: Vec<String>,
        grads: Option<&'a <AD as AutodiffBackend>::Gradients>,
        out: Vec<(String, Vec<f32>, bool)>,
    }
    impl ModuleVisitor<AD> for Values<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<AD, D>>) {
            let has_grad = self.grads.is_some_and(|g| p.val().grad(g).is_some());
            let values = p.val().into_data().convert::<f32>().to_vec().unwrap();
            self.out.push((self.path.join("."), values, has_grad));
        }
    }
    let mut v = Values {
        path: Vec::new(),
        grads,
        out: Vec::new(),
    };
    model.visit(&mut v);
    v.out
}

fn is_adapter(path: &str) -> bool {
    path.contains("_lora.")
}

/// The adapted model with every B drawn at random (PEFT starts B at zero,
/// which would make the adapters invisible to the forward).
fn random_b<M: LoraModel<AD>>(mut model: M) -> M {
    for slot in model.slots_mut() {
        if let Some(lora) = slot.lora.as_mut() {
            let [out, rank] = lora.lora_b.dims();
            let b = Tensor::random(
                [out, rank],
                Distribution::Normal(0.0, 0.2),
                &lora.lora_b.device(),
            );
            lora.lora_b = Param::initialized(lora.lora_b.id, b.require_grad());
        }
    }
    model
}

/// `plain` with each projection that `adapted` adapts replaced by
/// `W + scale·(B·A)ᵀ` (burn's `[in, out]` layout), built by hand from the
/// given A and B; the result keeps the autodiff graph to A and B.
fn merged_by_hand<M: LoraModel<AD>>(
    mut plain: M,
    adapters: &[Option<(Tensor<AD, 2>, Tensor<AD, 2>)>],
    scale: f64,
) -> M {
    for (slot, ab) in plain.slots_mut().into_iter().zip(adapters) {
        if let Some((a, b)) = ab {
            let w = slot.base.weight.val();
            let merged = w + b.clone().matmul(a.clone()).transpose() * scale;
            slot.base.weight = Param::initialized(slot.base.weight.id, merged);
        }
    }
    plain
}

fn adapter_values<M: LoraModel<AD>>(model: &M) -> Vec<Option<(Tensor<AD, 2>, Tensor<AD, 2>)>> {
    model
        .slots()
        .iter()
        .map(|s| {
            s.lora
                .as_ref()
                .map(|l| (l.lora_a.val().detach(), l.lora_b.val().detach()))
        })
        .collect()
}

fn max_abs<const D: usize>(a: Tensor<AD, D>, b: Tensor<AD, D>) -> f32 {
    (a - b).abs().max().into_scalar()
}

fn logits<M: BlockModel<AD>>(model: &M, vocab: usize) -> Tensor<AD, 3> {
    model.forward(random_tokens::<AD>(2, 7, vocab, 3, &Default::default()))
}

/// The adapted forward equals the hand-merged model's, and differs from
/// the base model's (the adapters act).
fn check_forward<M: LoraModel<AD> + BlockModel<AD> + Clone>(
    base: M,
    config: &LoraConfig,
    vocab: usize,
) -> M {
    let device = Default::default();
    let base = realised(base);
    let adapted = random_b(base.clone().with_lora(config, &device).unwrap());
    let merged = merged_by_hand(base.clone(), &adapter_values(&adapted), config.scale());
    let got = logits(&adapted, vocab);
    assert!(max_abs(got.clone(), logits(&merged, vocab)) <= TOL);
    assert!(max_abs(got, logits(&base, vocab)) > 1e-3);
    adapted
}

#[test]
fn llama_adapted_forward_is_the_merged_weights_forward() {
    let config = llama_config();
    let base = config.init::<AD>(&Default::default());
    let adapted = check_forward(base.clone(), &llama_lora(), config.vocab_size);
    // MLP tiles: adapted MLPs run plain, so the forward does not change.
    let tiled = adapted.clone().with_mlp_tiles(Some(3));
    let v = config.vocab_size;
    assert!(max_abs(logits(&tiled, v), logits(&adapted, v)) <= TOL);
    // The scale is alpha / rank.
    assert_eq!(adapted.layers[0].attn.q_lora.as_ref().unwrap().scale, 2.0);
}

#[test]
fn gpt2_adapted_forward_is_the_merged_weights_forward() {
    let config = gpt2_config();
    let base = config.init::<AD>(&Default::default());
    let adapted = check_forward(base, &gpt2_lora(), config.vocab_size);
    let block = &adapted.blocks[1];
    // `c_proj` adapts both of GPT-2's; rslora scales by alpha / √rank.
    assert!(block.attn.c_proj_lora.is_some() && block.mlp.c_proj_lora.is_some());
    assert_eq!(
        block.mlp.c_fc_lora.as_ref().unwrap().scale,
        6.0 / 3f64.sqrt()
    );
    // `attn.c_proj` only the attention's.
    let only_attn = LoraConfig::new(2, 2.0, vec!["attn.c_proj".parse().unwrap()]);
    let one = gpt2_config()
        .init::<AD>(&Default::default())
        .with_lora(&only_attn, &Default::default())
        .unwrap();
    assert!(one.blocks[0].attn.c_proj_lora.is_some());
    assert!(one.blocks[0].mlp.c_proj_lora.is_none() && one.blocks[0].attn.c_attn_lora.is_none());
}

/// A loss that weighs every logit differently (and the same each call).
fn loss(logits: Tensor<AD, 3>) -> Tensor<AD, 1> {
    let dims = logits.dims();
    let n = (dims[0] * dims[1] * dims[2]) as i64;
    let weights = Tensor::<AD, 1, Int>::arange(0..n, &logits.device())
        .float()
        .mul_scalar(0.37)
        .sin()
        .reshape(dims);
    (logits * weights).sum()
}

#[test]
fn only_adapters_get_gradients_equal_to_the_reference_graph() {
    let config = llama_config();
    let device = Default::default();
    let base = realised(config.init::<AD>(&device));
    let adapted = random_b(base.clone().with_lora(&llama_lora(), &device).unwrap());
    let tokens = random_tokens::<AD>(2, 7, config.vocab_size, 3, &device);
    let grads = loss(adapted.forward(tokens.clone())).backward();
    let seen = params(&adapted, Some(&grads));
    assert!(seen.iter().any(|(p, _, _)| is_adapter(p)));
    for (path, _, has_grad) in &seen {
        assert_eq!(*has_grad, is_adapter(path), "{path}");
    }

    // Reference: the frozen base with each weight W + s·(B·A)ᵀ, A and B leaves.
    let leaves: Vec<_> = adapter_values(&adapted)
        .into_iter()
        .map(|ab| ab.map(|(a, b)| (a.require_grad(), b.require_grad())))
        .collect();
    let reference = merged_by_hand(base.no_grad(), &leaves, llama_lora().scale());
    let ref_grads = loss(reference.forward(tokens)).backward();
    for (slot, ab) in adapted.slots().iter().zip(&leaves) {
        let (Some(lora), Some((a, b))) = (slot.lora, ab) else {
            continue;
        };
        let close = |ours: &Param<Tensor<AD, 2>>, theirs: &Tensor<AD, 2>| {
            let ours = ours.val().grad(&grads).unwrap();
            let theirs = theirs.grad(&ref_grads).unwrap();
            let scale = theirs.clone().abs().max().into_scalar().max(1.0);
            let err = (ours - theirs).abs().max().into_scalar() / scale;
            assert!(err <= TOL, "{}: {err}", slot.path);
        };
        close(&lora.lora_a, a);
        close(&lora.lora_b, b);
    }
}

#[test]
fn train_embeddings_leaves_embedding_and_head_trainable() {
    let config = llama_config();
    let device = Default::default();
    let lora = LoraConfig {
        train_embeddings: true,
        ..LoraConfig::new(2, 4.0, vec![LoraTarget::VProj])
    };
    let adapted = config
        .init::<AD>(&device)
        .with_lora(&lora, &device)
        .unwrap();
    let tokens = random_tokens::<AD>(2, 5, config.vocab_size, 1, &device);
    let grads = loss(adapted.forward(tokens)).backward();
    for (path, _, has_grad) in params(&adapted, Some(&grads)) {
        let trainable =
            is_adapter(&path) || path.starts_with("embed_tokens") || path.starts_with("lm_head");
        assert_eq!(has_grad, trainable, "{path}");
    }
}

#[test]
fn adamw_changes_only_the_adapters() {
    let config = llama_config();
    let device = Default::default();
    let mut model = realised(config.init::<AD>(&device))
        .with_lora(&llama_lora(), &device)
        .unwrap();
    let before = params(&model, None);
    let mut optim = AdamWConfig::new().with_weight_decay(0.1).init();
    for step in 0..3 {
        let tokens = random_tokens::<AD>(2, 6, config.vocab_size, step, &device);
        let grads = loss(model.forward(tokens)).backward();
        let grads = GradientsParams::from_grads(grads, &model);
        model = optim.step(1e-2, model, grads);
    }
    let after = params(&model, None);
    assert_eq!(before.len(), after.len());
    let mut adapters = 0;
    for ((path, old, _), (path2, new, _)) in before.iter().zip(&after) {
        assert_eq!(path, path2);
        if is_adapter(path) {
            adapters += 1;
            assert!(old != new, "{path} did not change");
        } else {
            // Bit-identical, decay included: frozen parameters get no step.
            assert!(
                old.iter().zip(new).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{path} changed"
            );
        }
    }
    assert_eq!(adapters, 2 * 7 * config.n_layer);
    assert_eq!(model.adapter_params().len(), adapters);
}

#[test]
fn merge_lora_keeps_the_logits_and_the_original_parameters() {
    let device = Default::default();
    let config = llama_config();
    let base = realised(config.init::<AD>(&device));
    let adapted = random_b(base.clone().with_lora(&llama_lora(), &device).unwrap());
    let merged = adapted.clone().merge_lora();
    let v = config.vocab_size;
    assert!(max_abs(logits(&merged, v), logits(&adapted, v)) <= TOL);
    assert_eq!(names::<AD, _>(&merged), names::<AD, _>(&base));
    assert!(merged.adapter_params().is_empty());
    let ids = |m: &models::Llama<AD>| {
        m.layers
            .iter()
            .map(|l| l.attn.q_proj.weight.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&merged), ids(&base));

    let config = gpt2_config();
    let base = realised(config.init::<AD>(&device));
    let adapted = random_b(base.clone().with_lora(&gpt2_lora(), &device).unwrap());
    let merged = adapted.clone().merge_lora();
    let v = config.vocab_size;
    assert!(max_abs(logits(&merged, v), logits(&adapted, v)) <= TOL);
    assert_eq!(names::<AD, _>(&merged), names::<AD, _>(&base));
}

fn read_config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(ADAPTER_CONFIG)).unwrap()).unwrap()
}

/// Tensor names and shapes of an adapter file.
fn shapes(dir: &Path) -> HashMap<String, Vec<usize>> {
    let bytes = std::fs::read(dir.join(ADAPTER_WEIGHTS)).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec()))
        .collect()
}

#[test]
fn llama_peft_files_have_peft_names_and_round_trip() {
    let device = Default::default();
    let config = llama_config();
    let base = realised(config.init::<AD>(&device));
    let lora = llama_lora();
    let adapted = random_b(base.clone().with_lora(&lora, &device).unwrap());
    let dir = tempfile::tempdir().unwrap();
    save_peft(
        &adapted,
        &lora,
        "meta-llama/Llama-3.2-1B",
        dir.path(),
        PeftDtype::F32,
    )
    .unwrap();

    let found = shapes(dir.path());
    assert_eq!(found.len(), 2 * 7 * config.n_layer);
    let (d, kv, ff) = (
        config.d_model,
        config.n_kv_head * config.head_dim(),
        config.d_ff,
    );
    let prefix = "base_model.model.model.layers.1";
    assert_eq!(
        found[&format!("{prefix}.self_attn.q_proj.lora_A.weight")],
        [4, d]
    );
    assert_eq!(
        found[&format!("{prefix}.self_attn.q_proj.lora_B.weight")],
        [d, 4]
    );
    assert_eq!(
        found[&format!("{prefix}.self_attn.k_proj.lora_B.weight")],
        [kv, 4]
    );
    assert_eq!(
        found[&format!("{prefix}.mlp.gate_proj.lora_A.weight")],
        [4, d]
    );
    assert_eq!(
        found[&format!("{prefix}.mlp.down_proj.lora_A.weight")],
        [4, ff]
    );

    let json = read_config(dir.path());
    assert_eq!(json["peft_type"], "LORA");
    assert_eq!(json["task_type"], "CAUSAL_LM");
    assert_eq!(json["r"], 4);
    assert_eq!(json["lora_alpha"], 8.0);
    assert_eq!(json["lora_dropout"], 0.0);
    let targets: Vec<&str> = json["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        targets,
        [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj"
        ]
    );
    assert_eq!(json["use_rslora"], false);
    assert_eq!(json["bias"], "none");
    assert_eq!(json["fan_in_fan_out"], false);
    assert_eq!(json["base_model_name_or_path"], "meta-llama/Llama-3.2-1B");
    assert_eq!(json["inference_mode"], true);
    assert!(json["modules_to_save"].is_null());
    assert_eq!(json["init_lora_weights"], true);

    let v = config.vocab_size;
    let want = logits(&adapted, v);
    let fresh = base.clone().with_lora(&lora, &device).unwrap();
    let loaded = load_peft(fresh, dir.path()).unwrap();
    assert_eq!(max_abs(logits(&loaded, v), want.clone()), 0.0);
    // A model without adapters gets them from the file.
    let loaded = load_peft(base.clone(), dir.path()).unwrap();
    assert_eq!(max_abs(logits(&loaded, v), want.clone()), 0.0);

    // bf16: half the bytes, values rounded.
    let bf = tempfile::tempdir().unwrap();
    save_peft(&adapted, &lora, "x", bf.path(), PeftDtype::Bf16).unwrap();
    let bytes = std::fs::read(bf.path().join(ADAPTER_WEIGHTS)).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    assert!(file
        .tensors()
        .iter()
        .all(|(_, t)| t.dtype() == safetensors::Dtype::BF16));
    let loaded = load_peft(base, bf.path()).unwrap();
    assert!(max_abs(logits(&loaded, v), want) < 0.05);
}

#[test]
fn gpt2_peft_files_have_peft_names_and_round_trip() {
    let device = Default::default();
    let config = gpt2_config();
    let base = realised(config.init::<AD>(&device));
    let lora = gpt2_lora();
    let adapted = random_b(base.clone().with_lora(&lora, &device).unwrap());
    let dir = tempfile::tempdir().unwrap();
    save_peft(&adapted, &lora, "gpt2", dir.path(), PeftDtype::F32).unwrap();
    let found = shapes(dir.path());
    let d = config.d_model;
    assert_eq!(found.len(), 2 * 4 * config.n_layer);
    let h = "base_model.model.transformer.h.0";
    assert_eq!(found[&format!("{h}.attn.c_attn.lora_A.weight")], [3, d]);
    assert_eq!(found[&format!("{h}.attn.c_attn.lora_B.weight")], [3 * d, 3]);
    assert_eq!(found[&format!("{h}.attn.c_proj.lora_B.weight")], [d, 3]);
    assert_eq!(found[&format!("{h}.mlp.c_fc.lora_B.weight")], [4 * d, 3]);
    assert_eq!(found[&format!("{h}.mlp.c_proj.lora_A.weight")], [3, 4 * d]);
    let json = read_config(dir.path());
    assert_eq!(json["fan_in_fan_out"], true);
    assert_eq!(json["use_rslora"], true);
    let v = config.vocab_size;
    let loaded = load_peft(base.with_lora(&lora, &device).unwrap(), dir.path()).unwrap();
    assert_eq!(max_abs(logits(&loaded, v), logits(&adapted, v)), 0.0);
}

/// The names burn's derive gave the models before adapters existed
/// (collected on the code before this change).
#[test]
fn models_without_adapters_keep_their_parameter_names_and_order() {
    let device = Default::default();
    let mut config = LlamaConfig::tiny();
    config.n_layer = 1;
    let llama = config.init::<AD>(&device);
    assert_eq!(names::<AD, _>(&llama), LLAMA_NAMES);
    config.attention_bias = AttentionBias::All;
    config.qk_norm = true;
    config.mlp_bias = true;
    config.tie_embeddings = true;
    assert_eq!(names::<AD, _>(&config.init::<AD>(&device)), QWEN_NAMES);
    let gpt2 = Gpt2Config {
        n_layer: 1,
        ..Gpt2Config::tiny()
    }
    .init::<AD>(&device);
    assert_eq!(names::<AD, _>(&gpt2), GPT2_NAMES);

    // With adapters, the old names keep their order around the new ones.
    let adapted = llama.with_lora(&llama_lora(), &device).unwrap();
    let all = names::<AD, _>(&adapted);
    let old: Vec<_> = all.iter().filter(|n| !is_adapter(n)).collect();
    assert_eq!(old, LLAMA_NAMES);
    assert!(all.contains(&"layers.0.attn.q_lora.lora_a".to_string()));
}

/// The PEFT files of `model` with fresh `lora` adapters, in a new folder.
fn adapters_of<M: LoraModel<AD>>(model: M, lora: &LoraConfig) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let adapted = model.with_lora(lora, &Default::default()).unwrap();
    save_peft(&adapted, lora, "base", dir.path(), PeftDtype::F32).unwrap();
    dir
}

#[test]
fn bad_configs_and_files_are_typed_errors() {
    let device = Default::default();
    assert_eq!(
        "qproj".parse::<LoraTarget>(),
        Err(LoraError::UnknownTarget("qproj".into()))
    );
    let llama = || llama_config().init::<AD>(&device);
    let zero = LoraConfig::new(0, 1.0, vec![LoraTarget::QProj]);
    assert!(matches!(
        llama().with_lora(&zero, &device),
        Err(LoraError::Invalid(_))
    ));
    let gpt2_on_llama = LoraConfig::new(2, 1.0, vec![LoraTarget::CAttn]);
    assert!(matches!(
        llama().with_lora(&gpt2_on_llama, &device),
        Err(LoraError::UnsupportedTarget { .. })
    ));
    let twice = llama().with_lora(&llama_lora(), &device).unwrap();
    assert!(matches!(
        twice.with_lora(&llama_lora(), &device),
        Err(LoraError::AlreadyAdapted)
    ));

    let lora = llama_lora();
    let adapted = llama().with_lora(&lora, &device).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let missing = load_peft(llama(), dir.path()).unwrap_err();
    assert!(
        matches!(missing, PeftError::MissingFile { .. }),
        "{missing}"
    );
    save_peft(&adapted, &lora, "base", dir.path(), PeftDtype::F32).unwrap();

    // Another rank in the model than in the file.
    let rank2 = LoraConfig::new(2, 8.0, all_llama_targets());
    let err = load_peft(llama().with_lora(&rank2, &device).unwrap(), dir.path()).unwrap_err();
    assert!(matches!(err, PeftError::Mismatch { .. }), "{err}");

    // A wrong shape: the file written from a model with a wider MLP.
    let wide = LlamaConfig {
        d_ff: 100,
        ..llama_config()
    }
    .init::<AD>(&device);
    let wide_dir = adapters_of(wide, &lora);
    let err = load_peft(llama(), wide_dir.path()).unwrap_err();
    assert!(matches!(err, PeftError::Shape { .. }), "{err}");
    assert!(err.to_string().contains("gate_proj.lora_B"), "{err}");

    // A tensor absent: the file of a one-layer model for a two-layer one.
    let short = LlamaConfig {
        n_layer: 1,
        ..llama_config()
    }
    .init::<AD>(&device);
    let short_dir = adapters_of(short, &lora);
    let err = load_peft(llama(), short_dir.path()).unwrap_err();
    assert!(matches!(err, PeftError::MissingTensor { .. }), "{err}");

    // An unknown target in the config.
    let mut json = read_config(dir.path());
    json["target_modules"] = serde_json::json!(["q_proj", "query_key_value"]);
    std::fs::write(dir.path().join(ADAPTER_CONFIG), json.to_string()).unwrap();
    let err = load_peft(llama(), dir.path()).unwrap_err();
    assert!(
        matches!(err, PeftError::Lora { source: LoraError::UnknownTarget(ref t), .. } if t == "query_key_value"),
        "{err}"
    );
    assert_eq!(err.to_string().lines().count(), 1);
}

const LLAMA_NAMES: [&str; 12] = [
    "embed_tokens.weight",
    "layers.0.input_layernorm.gamma",
    "layers.0.attn.q_proj.weight",
    "layers.0.attn.k_proj.weight",
    "layers.0.attn.v_proj.weight",
    "layers.0.attn.o_proj.weight",
    "layers.0.post_attention_layernorm.gamma",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
    "norm.gamma",
    "lm_head.weight",
];

const QWEN_NAMES: [&str; 20] = [
    "embed_tokens.weight",
    "layers.0.input_layernorm.gamma",
    "layers.0.attn.q_proj.weight",
    "layers.0.attn.q_proj.bias",
    "layers.0.attn.k_proj.weight",
    "layers.0.attn.k_proj.bias",
    "layers.0.attn.v_proj.weight",
    "layers.0.attn.v_proj.bias",
    "layers.0.attn.o_proj.weight",
    "layers.0.attn.o_proj.bias",
    "layers.0.attn.q_norm.gamma",
    "layers.0.attn.k_norm.gamma",
    "layers.0.post_attention_layernorm.gamma",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.gate_proj.bias",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.up_proj.bias",
    "layers.0.mlp.down_proj.weight",
    "layers.0.mlp.down_proj.bias",
    "norm.gamma",
];

const GPT2_NAMES: [&str; 16] = [
    "wte.weight",
    "wpe.weight",
    "blocks.0.ln_1.gamma",
    "blocks.0.ln_1.beta",
    "blocks.0.attn.c_attn.weight",
    "blocks.0.attn.c_attn.bias",
    "blocks.0.attn.c_proj.weight",
    "blocks.0.attn.c_proj.bias",
    "blocks.0.ln_2.gamma",
    "blocks.0.ln_2.beta",
    "blocks.0.mlp.c_fc.weight",
    "blocks.0.mlp.c_fc.bias",
    "blocks.0.mlp.c_proj.weight",
    "blocks.0.mlp.c_proj.bias",
    "ln_f.gamma",
    "ln_f.beta",
];
