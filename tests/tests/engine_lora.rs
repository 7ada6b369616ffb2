//! LoRA through the block-streamed engine: a frozen base held in host memory
//! (f32, bf16, int8 or NF4) with no gradient or optimizer state, and the
//! adapters trained, against plain burn (`Autodiff`, burn-optim AdamW) on the
//! same base and adapters. The base must come out bit-identical.

mod engine_common;

use std::collections::{HashMap, HashSet};

use burn::module::{AutodiffModule, Module, ModuleMapper, Param, ParamId};
use burn::optim::{AdamWConfig as BurnAdamW, GradientsParams, Optimizer};
use burn::prelude::*;
use burn_offload::quant::BaseDtype;
use burn_offload::{BlockModel, Engine, Frozen, FrozenDtype, StreamedModel};
use burn_offload_tests::{
    batch, lift, rel_err, values, TestAutodiff as AD, TestBackend as B, TRAJECTORY_TOL,
};
use engine_common::{engine_config, slot_count};
use models::lora::LoraModel;
use models::{cross_entropy, Gpt2Config, LlamaConfig, LoraConfig, LoraTarget};

/// Marks the adapters trainable and everything else frozen (what
/// `with_lora` does, for a model lifted from the engine's inner backend,
/// which keeps no `require_grad`).
struct TrainAdapters {
    path: Vec<String>,
}

impl ModuleMapper<AD> for TrainAdapters {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AD, D>>) -> Param<Tensor<AD, D>> {
        let adapter = self.path.iter().any(|p| p.ends_with("_lora"));
        param.set_require_grad(adapter)
    }
}

fn llama_lora() -> LoraConfig {
    let targets = ["q_proj", "v_proj", "o_proj", "down_proj"];
    LoraConfig::new(4, 8.0, targets.map(|t| t.parse().unwrap()).to_vec())
}

fn gpt2_lora() -> LoraConfig {
    LoraConfig {
        rslora: true,
        ..LoraConfig::new(3, 6.0, vec![LoraTarget::CAttn, LoraTarget::CFc])
    }
}

/// B random instead of zero, so the first steps move A too.
struct RandomB {
    path: Vec<String>,
}

impl ModuleMapper<B> for RandomB {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.path.last().is_some_and(|p| p == "lora_b") {
            let (id, tensor, _) = param.consume();
            let shape = tensor.shape();
            let random = Tensor::random(
                shape,
                burn::tensor::Distribution::Normal(0.0, 0.05),
                &tensor.device(),
            );
            return Param::initialized(id, random);
        }
        param
    }
}

/// Trains `model` (adapted, on the inner backend) for a few steps in the
/// engine with its base frozen in `dtype`, and plain burn from the engine's
/// own starting values; compares losses and adapters, and checks that the
/// base did not move and holds no optimizer state.
fn check<M>(model: M, lora: &LoraConfig, vocab: usize, dtype: FrozenDtype, fused: bool)
where
    M: StreamedModel<B> + LoraModel<B>,
    M::TrainModule: LoraModel<AD> + BlockModel<AD> + AutodiffModule<AD, InnerModule = M>,
{
    let device = Default::default();
    let frozen = Frozen {
        ids: model.frozen_ids(lora),
        dtype,
    };
    let adapters: HashSet<ParamId> = model.adapter_params().iter().map(|p| p.id).collect();
    let mut config = engine_config(fused);
    config.grad_clip = Some(0.5);
    let mut engine =
        Engine::with_frozen(model, Some(&frozen), config, std::slice::from_ref(&device)).unwrap();
    // Only the adapters have slots (gradients, moments) in the store.
    assert_eq!(slot_count(engine.store()), adapters.len());
    let start = engine.model();
    let base_before = frozen_values(&start, &frozen.ids);

    let mut reference = M::TrainModule::from_inner(start).map(&mut TrainAdapters { path: vec![] });
    let mut optim = BurnAdamW::new()
        .with_weight_decay(0.01)
        .init::<AD, M::TrainModule>();
    for step in 0..6u64 {
        let lr = 2e-2;
        let data = batch(2, 12, vocab, 40 + step);
        let (x, y) = lift(&data);
        let loss = cross_entropy(reference.forward(x), y);
        let want = loss.clone().into_scalar();
        let mut grads = GradientsParams::from_grads(loss.backward(), &reference);
        clip(&reference, &mut grads, 0.5);
        reference = optim.step(lr, reference, grads);

        let got = engine.step(&[data], lr).unwrap().loss;
        let err = (got - want).abs() / want;
        assert!(err <= TRAJECTORY_TOL, "step {step}: loss {got} vs {want}");
    }
    let want = values::<AD, _>(&reference, None);
    for id in &adapters {
        let err = rel_err(engine.param(id).unwrap(), &want[id]);
        assert!(err <= TRAJECTORY_TOL, "adapter {id}: relative error {err}");
    }
    for id in &frozen.ids {
        assert!(engine.param(id).is_none(), "frozen {id} has a slot");
    }
    let after = engine.model();
    assert_eq!(
        frozen_values(&after, &frozen.ids),
        base_before,
        "the frozen base moved"
    );
}

/// Global-norm clipping of the reference's gradients to `max_norm`.
fn clip<M: Module<AD>>(model: &M, grads: &mut GradientsParams, max_norm: f64) {
    struct Norm<'a> {
        grads: &'a GradientsParams,
        sum_sq: f64,
    }
    impl burn::module::ModuleVisitor<AD> for Norm<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AD, D>>) {
            if let Some(g) = self.grads.get::<B, D>(param.id) {
                self.sum_sq += g.square().sum().into_scalar() as f64;
            }
        }
    }
    struct Scale<'a> {
        grads: &'a mut GradientsParams,
        scale: f32,
    }
    impl ModuleMapper<AD> for Scale<'_> {
        fn map_float<const D: usize>(
            &mut self,
            param: Param<Tensor<AD, D>>,
        ) -> Param<Tensor<AD, D>> {
            if let Some(g) = self.grads.remove::<B, D>(param.id) {
                self.grads.register(param.id, g * self.scale);
            }
            param
        }
    }
    let mut norm = Norm { grads, sum_sq: 0.0 };
    model.visit(&mut norm);
    let norm = norm.sum_sq.sqrt();
    if norm > max_norm {
        let scale = (max_norm / norm) as f32;
        let _ = model.clone().map(&mut Scale { grads, scale });
    }
}

/// The values of the parameters in `ids`, by id, bit patterns.
fn frozen_values<M: Module<B>>(model: &M, ids: &HashSet<ParamId>) -> HashMap<ParamId, Vec<u32>> {
    struct Read<'a> {
        ids: &'a HashSet<ParamId>,
        out: HashMap<ParamId, Vec<u32>>,
    }
    impl burn::module::ModuleVisitor<B> for Read<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.ids.contains(&param.id) {
                let v = param.val().into_data().to_vec::<f32>().unwrap();
                self.out
                    .insert(param.id, v.iter().map(|x| x.to_bits()).collect());
            }
        }
    }
    let mut read = Read {
        ids,
        out: HashMap::new(),
    };
    model.visit(&mut read);
    assert_eq!(read.out.len(), ids.len());
    read.out
}

fn llama(seed: u64, tie_embeddings: bool) -> (models::Llama<B>, usize) {
    let device = Default::default();
    B::seed(&device, seed);
    let config = LlamaConfig {
        n_layer: 3,
        tie_embeddings,
        ..LlamaConfig::tiny()
    };
    let model = config
        .init::<B>(&device)
        .with_lora(&llama_lora(), &device)
        .unwrap()
        .map(&mut RandomB { path: vec![] });
    (model, config.vocab_size)
}

#[test]
fn llama_lora_with_an_f32_base_trains_like_plain_burn_in_both_modes_tied_or_not() {
    for (fused, tied) in [(false, false), (true, false), (false, true)] {
        let (model, vocab) = llama(1, tied);
        check(model, &llama_lora(), vocab, FrozenDtype::F32, fused);
    }
}

#[test]
fn gpt2_lora_trains_like_plain_burn() {
    let device = Default::default();
    let config = Gpt2Config {
        n_layer: 3,
        ..Gpt2Config::tiny()
    };
    let model = config
        .init::<B>(&device)
        .with_lora(&gpt2_lora(), &device)
        .unwrap()
        .map(&mut RandomB { path: vec![] });
    check(
        model,
        &gpt2_lora(),
        config.vocab_size,
        FrozenDtype::F32,
        false,
    );
}

/// A base held in bf16, int8 or NF4 is dequantised on the device as the
/// host reference dequantises it: the engine then trains like plain burn
/// on the dequantised base.
#[test]
fn llama_lora_on_a_bf16_int8_or_nf4_base_trains_like_plain_burn_on_its_values() {
    for base in BaseDtype::ALL {
        let (model, vocab) = llama(2, false);
        check(model, &llama_lora(), vocab, FrozenDtype::Base(base), false);
    }
}
