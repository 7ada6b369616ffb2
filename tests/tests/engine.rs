//! The block-streamed engine against plain burn (`Autodiff<B>` on the whole
//! model, burn-optim AdamW) on random weights and tokens.
//!
//! Relative error of a tensor: `‖engine − reference‖₂ / ‖reference‖₂` (normwise).

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::{AdamWConfig as BurnAdamW, GradientsParams, Optimizer};
use burn::prelude::*;
use burn_offload::checkpoint::CheckpointDir;
use burn_offload::{
    AdamWConfig, BatchError, BlockModel, Compute, ConfigError, Engine, EngineConfig, EngineError,
    OptimizerConfig, OptimizerError,
};
use burn_offload_tests::{
    batch, lift, rel_err, values, Batch, TestAutodiff as AD, TestBackend as B, TOL, TRAJECTORY_TOL,
};
use models::{cross_entropy, Gpt2Config, LlamaConfig};

/// Parameters (slots) the engine's store holds, over all groups.
fn slot_count(store: &burn_offload::HostStore) -> usize {
    store.groups.iter().map(|g| g.slots.len()).sum()
}

fn engine_config(fused: bool) -> EngineConfig {
    EngineConfig {
        optimizer: OptimizerConfig::AdamW(AdamWConfig {
            weight_decay: 0.01,
            ..Default::default()
        }),
        grad_clip: None,
        fused,
        // Small chunks so the chunked head really splits the sequence.
        loss_chunk_tokens: 8,
        // Off here so fused mode runs its single-pass schedule; tested below.
        skip_non_finite: false,
        overlap: true,
        host_checkpoints: true,
        compute: Compute::Fp32,
        cast_on_device: false,
        compute_precision_gradients: false,
        eight_bit_moments: false,
        kept_graphs: 0,
        kept_attention: 0,
        blocking_sync: true,
        hold_updates_for_copies: true,
        gradient_blocks_in_flight: 1,
    }
}

/// `memo_used`: whether the model's attention runs as one operation the
/// recompute can hand the forward's output to (not the reference that
/// burn differentiates op by op, as a sliding window on this backend is).
fn check_gradients<M>(model: M, vocab: usize, memo_used: bool)
where
    M: BlockModel<AD> + AutodiffModule<AD>,
    M::InnerModule: BlockModel<B> + burn::module::HasAutodiffModule<AD, TrainModule = M>,
    <M::InnerModule as BlockModel<B>>::Block: burn::module::HasAutodiffModule<AD>,
    <<M::InnerModule as BlockModel<B>>::Block as burn::module::HasAutodiffModule<AD>>::TrainModule:
        burn_offload::DecoderBlock<AD>,
{
    let data = batch(2, 16, vocab, 7);
    let (x, y) = lift(&data);
    let grads = cross_entropy(model.forward(x), y).backward();
    let want = values::<AD, _>(&model, Some(&grads));

    // Block inputs in host memory and on the device (on a CPU backend both
    // are the same memory; the GPU run of this test covers both paths), and
    // none, one or every block's forward graph kept instead of recomputed
    // (more than there are blocks means all), and the recomputed blocks'
    // attention outputs kept from the forward, the last one's or every
    // one's (which the recompute must then take in place of its own, each
    // block its own: the count of those it took grows).
    let cases = [
        (true, 0, 0),
        (false, 0, 0),
        (true, 1, 0),
        (false, 99, 0),
        (true, 0, 99),
        (false, 1, 99),
        (true, 0, 1),
        (false, 1, 1),
    ];
    for (host_checkpoints, kept_graphs, kept_attention) in cases {
        let config = EngineConfig {
            host_checkpoints,
            kept_graphs,
            kept_attention,
            ..engine_config(false)
        };
        let replayed = burn_offload::ops::attention::replayed_attention_outputs();
        let mut engine = Engine::new(model.valid(), config, &Default::default()).unwrap();
        engine
            .accumulate_gradients(std::slice::from_ref(&data))
            .unwrap();
        assert_eq!(want.len(), slot_count(engine.store()));
        for (id, reference) in &want {
            let err = rel_err(&engine.grad(id).unwrap(), reference);
            assert!(
                err <= TOL,
                "gradient of {id} (host checkpoints: {host_checkpoints}, kept graphs: {kept_graphs}, kept attention: {kept_attention}): relative error {err}"
            );
        }
        if kept_attention > 0 && memo_used {
            let taken = burn_offload::ops::attention::replayed_attention_outputs() - replayed;
            assert!(
                taken > 0,
                "no recompute took the forward's attention output"
            );
        }
    }
}

#[test]
fn engine_gradients_equal_full_graph_gradients_gpt2() {
    let config = Gpt2Config::tiny();
    check_gradients(
        config.init::<AD>(&Default::default()),
        config.vocab_size,
        true,
    );
}

#[test]
fn engine_gradients_equal_full_graph_gradients_llama() {
    let config = LlamaConfig::tiny();
    check_gradients(
        config.init::<AD>(&Default::default()),
        config.vocab_size,
        true,
    );
}

/// The MLP over tiles of tokens (one operation that recomputes its
/// projections in the backward, `burn_offload::ops::mlp`) gives the plain
/// model's gradients, through plain burn and through the engine: 32 tokens
/// in tiles of 5, and in one tile.
#[test]
fn mlp_tiles_give_the_plain_models_gradients() {
    let config = LlamaConfig::tiny();
    let model = config.init::<AD>(&Default::default());
    let data = batch(2, 16, config.vocab_size, 7);
    let (x, y) = lift(&data);
    let grads = cross_entropy(model.forward(x.clone()), y.clone()).backward();
    let want = values::<AD, _>(&model, Some(&grads));
    for tile in [5, 32] {
        let tiled = model.clone().with_mlp_tiles(Some(tile));
        let grads = cross_entropy(tiled.forward(x.clone()), y.clone()).backward();
        let got = values::<AD, _>(&tiled, Some(&grads));
        let mut engine =
            Engine::new(tiled.valid(), engine_config(false), &Default::default()).unwrap();
        engine
            .accumulate_gradients(std::slice::from_ref(&data))
            .unwrap();
        for (id, reference) in &want {
            let streamed = engine.grad(id).unwrap();
            for (path, grad) in [("plain burn", &got[id][..]), ("engine", &streamed[..])] {
                let err = rel_err(grad, reference);
                assert!(
                    err <= TOL,
                    "tiles of {tile}, {path}: gradient of {id} off by {err}"
                );
            }
        }
    }
}

/// Small configs of every Llama-shaped family, each with what sets it apart.
fn family_configs() -> Vec<(&'static str, LlamaConfig)> {
    use models::llama::{AttentionBias, Family, RopeScaling};
    let tiny = LlamaConfig::tiny();
    vec![
        (
            // Llama 3.x: scaled rope (some frequencies scaled, some kept,
            // some blended at this head size and context), 12-wide heads,
            // biases everywhere, untied head.
            "llama3",
            LlamaConfig {
                d_model: 72,
                n_head: 6,
                n_kv_head: 2,
                rope_scaling: Some(RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 32,
                }),
                attention_bias: AttentionBias::All,
                mlp_bias: true,
                ..tiny.clone()
            },
        ),
        (
            "llama-linear-rope-tied",
            LlamaConfig {
                rope_scaling: Some(RopeScaling::Linear { factor: 4.0 }),
                tie_embeddings: true,
                ..tiny.clone()
            },
        ),
        (
            "mistral",
            LlamaConfig {
                // Shorter than the tests' sequences.
                sliding_window: Some(5),
                family: Family::Mistral,
                ..tiny.clone()
            },
        ),
        (
            "qwen2",
            LlamaConfig {
                attention_bias: AttentionBias::Qkv,
                tie_embeddings: true,
                family: Family::Qwen2,
                ..tiny.clone()
            },
        ),
        (
            "qwen3",
            LlamaConfig {
                d_model: 48,
                head_dim: Some(24),
                qk_norm: true,
                tie_embeddings: true,
                family: Family::Qwen3,
                ..tiny
            },
        ),
    ]
}

#[test]
fn engine_gradients_equal_full_graph_gradients_for_every_family() {
    for (name, config) in family_configs() {
        config.validate().unwrap();
        eprintln!("family {name}");
        let model = config.init::<AD>(&Default::default());
        assert_eq!(model.num_params(), config.num_params(), "{name}");
        check_gradients(model, config.vocab_size, false);
    }
}

/// Multiplies every gradient by `scale` (global-norm clipping for the reference).
struct ScaleGrads<'a> {
    grads: &'a mut GradientsParams,
    scale: f32,
    sum_sq: f64,
}

impl ModuleMapper<AD> for ScaleGrads<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AD, D>>) -> Param<Tensor<AD, D>> {
        let g = self.grads.remove::<B, D>(param.id).unwrap();
        self.sum_sq += g.clone().square().sum().into_scalar() as f64;
        self.grads.register(param.id, g * self.scale);
        param
    }
}

fn global_norm(model: &models::Llama<AD>, grads: &mut GradientsParams) -> f64 {
    let mut m = ScaleGrads {
        grads,
        scale: 1.0,
        sum_sq: 0.0,
    };
    let _ = model.clone().map(&mut m);
    m.sum_sq.sqrt()
}

/// Runs `steps` of plain burn (reference) and of the engine from the same
/// initial weights and batches; compares losses, parameters and Adam moments.
fn check_training(fused: bool, clip: Option<f64>) {
    check_training_keeping(fused, clip, 0);
}

/// [`check_training`] with the last `kept_graphs` blocks not recomputed.
fn check_training_keeping(fused: bool, clip: Option<f64>, kept_graphs: usize) {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let mut model = config.init::<AD>(&device);
    let mut engine_cfg = engine_config(fused);
    engine_cfg.grad_clip = clip;
    engine_cfg.kept_graphs = kept_graphs;
    let mut engine = Engine::new(model.valid(), engine_cfg, &device).unwrap();
    let mut optim = BurnAdamW::new()
        .with_weight_decay(0.01)
        .init::<AD, models::Llama<AD>>();

    let steps = 20;
    for step in 0..steps {
        let lr = 3e-3 * (1.0 + (step as f64 * 0.3).cos()) / 2.0 + 1e-4;
        let data = batch(2, 16, config.vocab_size, 100 + step);
        let (x, y) = lift(&data);
        let loss = cross_entropy(model.forward(x), y);
        let want_loss = loss.clone().into_scalar();
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        if let Some(clip) = clip {
            let norm = global_norm(&model, &mut grads);
            let scale = if norm > clip {
                (clip / norm) as f32
            } else {
                1.0
            };
            let _ = model.clone().map(&mut ScaleGrads {
                grads: &mut grads,
                scale,
                sum_sq: 0.0,
            });
        }
        model = optim.step(lr, model, grads);

        let report = engine.step(&[data], lr).unwrap();
        let err = (report.loss - want_loss).abs() / want_loss;
        assert!(
            err <= TRAJECTORY_TOL,
            "step {step}: loss {} vs {want_loss}",
            report.loss
        );
    }
    assert_eq!(engine.updates(), steps);
    for (id, reference) in values::<AD, _>(&model, None) {
        let err = rel_err(engine.param(&id).unwrap(), &reference);
        assert!(
            err <= TRAJECTORY_TOL,
            "parameter {id} after {steps} steps: relative error {err}"
        );
    }
    // Optimizer state: Adam's first and second moments, parameter by parameter.
    let mut moments = Moments {
        record: optim.to_record(),
        engine: &mut engine,
        checked: 0,
    };
    model.visit(&mut moments);
    let checked = moments.checked;
    assert_eq!(checked, slot_count(engine.store()));
}

struct Moments<'a> {
    record: <burn::optim::adaptor::OptimizerAdaptor<burn::optim::AdamW, models::Llama<AD>, AD> as Optimizer<models::Llama<AD>, AD>>::Record,
    engine: &'a mut Engine<B, models::Llama<B>>,
    checked: usize,
}

impl ModuleVisitor<AD> for Moments<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AD, D>>) {
        let state = self
            .record
            .remove(&param.id)
            .unwrap()
            .into_state::<D>()
            .momentum;
        let (m, v) = self.engine.moments(&param.id).unwrap();
        let want_m = state.moment_1.into_data().to_vec::<f32>().unwrap();
        let want_v = state.moment_2.into_data().to_vec::<f32>().unwrap();
        let (em, ev) = (rel_err(&m, &want_m), rel_err(&v, &want_v));
        assert!(
            em <= TRAJECTORY_TOL && ev <= TRAJECTORY_TOL,
            "moments of {}: relative errors {em}, {ev}",
            param.id
        );
        self.checked += 1;
    }
}

#[test]
fn twenty_steps_match_plain_burn_adamw() {
    check_training(false, None);
}

#[test]
fn twenty_fused_steps_match_plain_burn_adamw() {
    check_training(true, None);
}

#[test]
fn global_norm_clipping_matches_reference_in_both_modes() {
    check_training(false, Some(0.5));
    check_training(true, Some(0.5));
}

/// Kept forward graphs across steps: deferred updates must not touch a
/// kept block's weights before its backward, and fused mode with clipping
/// runs forward and backward twice per step, each pass keeping its own graphs.
#[test]
fn kept_graphs_train_like_plain_burn_in_both_modes() {
    check_training_keeping(false, Some(0.5), 1);
    check_training_keeping(true, Some(0.5), 2);
}

#[test]
fn gradient_accumulation_equals_one_large_batch() {
    let device = Default::default();
    // `valid()` materialises the lazily initialised parameters, so both
    // engines start from the same weights. GPT-2 differentiates its
    // embeddings on the device; Llama's lookup gradient is formed on the
    // host, where the head's gradients are folded early and the table's
    // rows added per micro-batch.
    let gpt2 = Gpt2Config::tiny();
    check_accumulation(gpt2.init::<AD>(&device).valid(), gpt2.vocab_size);
    let llama = LlamaConfig::tiny();
    check_accumulation(llama.init::<AD>(&device).valid(), llama.vocab_size);
}

fn check_accumulation<M>(model: M, vocab: usize)
where
    M: BlockModel<B> + burn::module::HasAutodiffModule<AD>,
    M::TrainModule: BlockModel<AD>,
    M::Block: burn::module::HasAutodiffModule<AD>,
    <M::Block as burn::module::HasAutodiffModule<AD>>::TrainModule: burn_offload::DecoderBlock<AD>,
{
    let device = Default::default();
    let (x, y) = batch(6, 12, vocab, 3);
    let mut large = Engine::new(model.clone(), engine_config(false), &device).unwrap();
    let loss_large = large
        .accumulate_gradients(&[(x.clone(), y.clone())])
        .unwrap();
    let mut small = Engine::new(model.clone(), engine_config(false), &device).unwrap();
    // A first accumulation on other data: the next one must replace it, not
    // add to it (the buffer is written over, not zeroed first).
    let (x_other, y_other) = batch(2, 12, vocab, 7);
    small.accumulate_gradients(&[(x_other, y_other)]).unwrap();
    let micro: Vec<Batch> = (0..3)
        .map(|i| (x.clone().narrow(0, 2 * i, 2), y.clone().narrow(0, 2 * i, 2)))
        .collect();
    let loss_small = small.accumulate_gradients(&micro).unwrap();
    assert!(
        (loss_large - loss_small).abs() / loss_large <= TOL,
        "{loss_large} vs {loss_small}"
    );
    let ids = burn::module::list_param_ids(&model);
    for id in &ids {
        let err = rel_err(&small.grad(id).unwrap(), &large.grad(id).unwrap());
        assert!(err <= TOL, "gradient of {id}: relative error {err}");
    }
    // The global norm (what clipping scales by) measures the accumulated
    // gradient: every micro-batch's rows of the table, in both modes.
    for overlap in [true, false] {
        let norm = |batches: &[Batch]| {
            let config = EngineConfig {
                overlap,
                ..engine_config(false)
            };
            let mut engine = Engine::new(model.clone(), config, &device).unwrap();
            engine.step(batches, 1e-3).unwrap().grad_norm
        };
        let (whole, accumulated) = (norm(&[(x.clone(), y.clone())]), norm(&micro));
        let err = ((whole - accumulated) / whole).abs();
        assert!(
            err <= TOL as f64,
            "overlap {overlap}: norm {accumulated} accumulated, {whole} in one batch"
        );
    }
}

#[test]
fn device_resident_parameters_are_flat_in_depth() {
    let device = Default::default();
    let peak = |layers: usize| {
        let config = LlamaConfig {
            n_layer: layers,
            ..LlamaConfig::tiny()
        };
        let mut engine =
            Engine::new(config.init::<B>(&device), engine_config(false), &device).unwrap();
        engine
            .step(&[batch(2, 8, config.vocab_size, 1)], 1e-3)
            .unwrap();
        engine
            .step(&[batch(2, 8, config.vocab_size, 2)], 1e-3)
            .unwrap();
        let block_bytes = engine.store().groups[1].param_bytes() as f64;
        (engine.pager_stats().peak_resident_bytes as f64, block_bytes)
    };
    let (shallow, block) = peak(4);
    let (deep, _) = peak(16);
    assert!(
        (deep - shallow).abs() <= 0.1 * shallow,
        "peak {shallow} B at 4 layers vs {deep} B at 16"
    );
    assert!(
        deep <= 3.0 * block,
        "peak {deep} B exceeds three blocks ({block} B each)"
    );
}

/// `Engine::new` and `Engine::with_store` refuse the same invalid settings
/// (a negative clip would invert every update).
#[test]
fn every_constructor_validates_the_config() {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let store = || {
        let engine = Engine::new(config.init::<B>(&device), engine_config(false), &device).unwrap();
        engine_into_store(engine)
    };
    let invalid = [
        EngineConfig {
            grad_clip: Some(-1.0),
            ..engine_config(false)
        },
        EngineConfig {
            grad_clip: Some(f64::NAN),
            ..engine_config(false)
        },
        EngineConfig {
            loss_chunk_tokens: 0,
            ..engine_config(false)
        },
    ];
    for bad in invalid {
        let err = Engine::new(config.init::<B>(&device), bad.clone(), &device)
            .err()
            .unwrap();
        assert!(matches!(err, EngineError::Config(_)), "new: {err}");
        let err = Engine::with_store(config.init::<B>(&device), store(), bad.clone(), &device)
            .err()
            .unwrap();
        assert!(
            matches!(err, EngineError::Config(_)),
            "with_store accepted {bad:?}: {err}"
        );
    }
}

#[test]
fn misuse_is_a_clear_error() {
    let device = Default::default();
    let config = LlamaConfig::tiny();

    // A model whose blocks do not match the store.
    let engine = Engine::new(config.init::<B>(&device), engine_config(false), &device).unwrap();
    let store = engine_into_store(engine);
    let wider = LlamaConfig {
        d_ff: 200,
        ..config.clone()
    }
    .init::<B>(&device);
    let err = Engine::with_store(wider, store, engine_config(false), &device)
        .err()
        .unwrap();
    assert!(matches!(err, EngineError::Store(_)), "{err}");
    assert!(
        err.to_string()
            .contains("block 0 of the model has parameter shapes"),
        "{err}"
    );

    // Inputs and targets of different shapes; an empty batch list.
    let mut engine = Engine::new(config.init::<B>(&device), engine_config(false), &device).unwrap();
    let (x, _) = batch(2, 8, config.vocab_size, 1);
    let (_, y) = batch(2, 9, config.vocab_size, 1);
    let err = engine.step(&[(x, y)], 1e-3).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Batch(BatchError::TargetShape {
                index: 0,
                inputs: [2, 8],
                targets: [2, 9]
            })
        ),
        "{err}"
    );
    assert!(matches!(
        engine.step(&[], 1e-3).unwrap_err(),
        EngineError::Batch(BatchError::NoMicroBatches)
    ));
    let err = engine.step(&[batch(1, 4, 256, 0)], f64::NAN).unwrap_err();
    assert!(
        matches!(err, EngineError::Optimizer(OptimizerError::LearningRate(lr)) if lr.is_nan()),
        "{err}"
    );

    // Invalid optimizer values.
    let mut bad = engine_config(false);
    bad.optimizer = OptimizerConfig::AdamW(AdamWConfig {
        beta_2: 1.5,
        ..Default::default()
    });
    let err = Engine::new(config.init::<B>(&device), bad, &device)
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            EngineError::Optimizer(OptimizerError::OutOfRange { name: "beta_2", .. })
        ),
        "{err}"
    );

    // Fused mode cannot accumulate micro-batches.
    let mut fused = Engine::new(config.init::<B>(&device), engine_config(true), &device).unwrap();
    let b = batch(1, 4, 256, 0);
    let err = fused.step(&[b.clone(), b], 1e-3).unwrap_err();
    assert!(
        matches!(err, EngineError::Config(ConfigError::FusedAccumulation)),
        "{err}"
    );
}

fn engine_into_store(engine: Engine<B, models::Llama<B>>) -> burn_offload::HostStore {
    engine.into_store()
}

#[test]
fn engine_trains_a_model_initialised_on_offload_like_one_on_the_inner_backend() {
    use burn_offload::Offload;
    use burn_offload::StoreLayout;
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let host_model = config.init::<Offload<B>>(&device);
    // A second store with the same values, bound positionally into a model on B.
    let layout = StoreLayout::f32_gradients(true);
    let store =
        burn_offload::HostStore::from_modules(&host_model, host_model.blocks(), layout).unwrap();
    let mut on_b = Engine::with_store(
        config.init::<B>(&device),
        store,
        engine_config(false),
        &device,
    )
    .unwrap();
    let mut on_offload = Engine::new(host_model, engine_config(false), &device).unwrap();

    for step in 0..3 {
        let (x, y) = batch(2, 8, config.vocab_size, step);
        let off_batch = (
            Tensor::from_data(x.to_data(), &device),
            Tensor::from_data(y.to_data(), &device),
        );
        let want = on_b.step(&[(x, y)], 1e-2).unwrap();
        let got = on_offload.step(&[off_batch], 1e-2).unwrap();
        assert!(
            (got.loss - want.loss).abs() <= TOL * want.loss,
            "step {step}: {} vs {}",
            got.loss,
            want.loss
        );
    }
    for (g, (a, b)) in on_offload
        .store()
        .groups
        .iter()
        .zip(&on_b.store().groups)
        .enumerate()
    {
        let err = rel_err(a.params.as_slice(), b.params.as_slice());
        assert!(err <= TOL, "group {g}: relative error {err}");
    }
}

/// A model whose `embed` is a lookup in a table its head reads too (tied
/// weights): the table's gradient is the head's plus the embedding's
/// scatter-add, and its norm counts every row, not only the looked-up ones.
mod tied {
    use burn::module::Param;
    use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
    use burn::prelude::*;
    use burn_offload::{BlockModel, DecoderBlock, Documents};

    pub const VOCAB: usize = 16;

    #[derive(Module, Debug)]
    pub struct Mix<B: Backend> {
        pub proj: Linear<B>,
    }

    impl<B: Backend> DecoderBlock<B> for Mix<B> {
        fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
            x.clone() + self.proj.forward(x).tanh()
        }
        /// Position-wise: documents change nothing.
        fn forward_in(&self, x: Tensor<B, 3>, _: &Documents) -> Tensor<B, 3> {
            self.forward(x)
        }
    }

    #[derive(Module, Debug)]
    pub struct Model<B: Backend> {
        pub embed: Embedding<B>,
        pub blocks: Vec<Mix<B>>,
    }

    impl<B: Backend> Model<B> {
        pub fn new(device: &B::Device) -> Self {
            Self {
                embed: EmbeddingConfig::new(VOCAB, 8).init(device),
                blocks: (0..2)
                    .map(|_| Mix {
                        proj: LinearConfig::new(8, 8).init(device),
                    })
                    .collect(),
            }
        }
    }

    impl<B: Backend> BlockModel<B> for Model<B> {
        type Block = Mix<B>;
        fn embed(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
            self.embed.forward(tokens)
        }
        fn embed_in(&self, tokens: Tensor<B, 2, Int>, _: &burn_offload::Documents) -> Tensor<B, 3> {
            self.embed(tokens)
        }
        fn blocks(&self) -> &[Mix<B>] {
            &self.blocks
        }
        fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
            hidden.matmul(self.embed.weight.val().transpose().unsqueeze())
        }
        fn vocab_size(&self) -> usize {
            VOCAB
        }
        fn embedding_table(&self) -> Option<&Param<Tensor<B, 2>>> {
            Some(&self.embed.weight)
        }
    }
}

#[test]
fn a_head_tied_to_the_lookup_table_trains_like_plain_burn() {
    let device = Default::default();
    let model = tied::Model::<AD>::new(&device);
    check_gradients(model.clone(), tied::VOCAB, false);
    // The global norm of accumulated micro-batches, in both modes, against
    // the reference's: the head's gradient fills every row of the table.
    let data = batch(4, 8, tied::VOCAB, 11);
    let (x, y) = lift(&data);
    let grads = cross_entropy(model.forward(x), y).backward();
    let want = values::<AD, _>(&model, Some(&grads))
        .values()
        .flat_map(|g| g.iter().map(|&v| (v as f64) * (v as f64)))
        .sum::<f64>()
        .sqrt();
    let micro: Vec<Batch> = (0..2)
        .map(|i| {
            (
                data.0.clone().narrow(0, 2 * i, 2),
                data.1.clone().narrow(0, 2 * i, 2),
            )
        })
        .collect();
    for overlap in [true, false] {
        let config = EngineConfig {
            overlap,
            ..engine_config(false)
        };
        let mut engine = Engine::new(model.valid(), config, &device).unwrap();
        let got = engine.step(&micro, 1e-3).unwrap().grad_norm;
        let err = ((got - want) / want).abs();
        assert!(
            err <= TOL as f64,
            "overlap {overlap}: norm {got}, reference {want}"
        );
    }
}

/// A model that breaks the block contract: its block widens the hidden state.
mod widening {
    use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
    use burn::prelude::*;
    use burn_offload::{BlockModel, DecoderBlock};

    #[derive(Module, Debug)]
    pub struct Widen<B: Backend> {
        pub proj: Linear<B>,
    }

    impl<B: Backend> DecoderBlock<B> for Widen<B> {
        fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
            self.proj.forward(x)
        }
        /// Position-wise: documents change nothing.
        fn forward_in(&self, x: Tensor<B, 3>, _: &burn_offload::Documents) -> Tensor<B, 3> {
            self.forward(x)
        }
    }

    #[derive(Module, Debug)]
    pub struct Model<B: Backend> {
        pub embed: Embedding<B>,
        pub blocks: Vec<Widen<B>>,
        pub head: Linear<B>,
    }

    impl<B: Backend> Model<B> {
        pub fn new(device: &B::Device) -> Self {
            Self {
                embed: EmbeddingConfig::new(16, 8).init(device),
                blocks: vec![Widen {
                    proj: LinearConfig::new(8, 9).init(device),
                }],
                head: LinearConfig::new(9, 16).init(device),
            }
        }
    }

    impl<B: Backend> BlockModel<B> for Model<B> {
        type Block = Widen<B>;
        fn embed(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
            self.embed.forward(tokens)
        }
        fn embed_in(&self, tokens: Tensor<B, 2, Int>, _: &burn_offload::Documents) -> Tensor<B, 3> {
            self.embed(tokens)
        }
        fn blocks(&self) -> &[Widen<B>] {
            &self.blocks
        }
        fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
            self.head.forward(hidden)
        }
        fn vocab_size(&self) -> usize {
            16
        }
    }
}

#[test]
fn a_block_that_changes_the_hidden_shape_is_a_clear_error() {
    let device = Default::default();
    let mut engine = Engine::new(
        widening::Model::<B>::new(&device),
        engine_config(false),
        &device,
    )
    .unwrap();
    let before = engine.store().groups[1].params.as_slice().to_vec();
    let err = engine
        .step(&[batch(2, 4, 16, 0)], 1e-3)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "block 0 returned hidden states of shape [2, 4, 9] for an input of shape [2, 4, 8]"
        ),
        "{err}"
    );
    assert_eq!(engine.updates(), 0);
    assert_eq!(
        engine.store().groups[1].params.as_slice(),
        &before[..],
        "a failed step changed parameters"
    );
}

#[test]
fn a_non_finite_step_is_skipped_and_changes_nothing() {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    for fused in [false, true] {
        let mut cfg = engine_config(fused);
        cfg.skip_non_finite = true;
        let mut engine = Engine::new(config.init::<B>(&device), cfg, &device).unwrap();
        engine
            .step(&[batch(2, 8, config.vocab_size, 1)], 1e-3)
            .unwrap();
        // Poison the final norm so every loss is NaN.
        let stem = &mut engine.store_mut().groups[0];
        let norm = stem
            .slots
            .iter()
            .find(|s| s.name == "norm.gamma")
            .unwrap()
            .clone();
        stem.params.as_mut_slice()[norm.offset] = f32::NAN;
        let snapshot = |e: &mut Engine<B, models::Llama<B>>| {
            e.store()
                .groups
                .iter()
                .map(|g| {
                    let (m, v) = g.moments.f32().expect("f32 moments");
                    [g.params.as_slice(), m, v].concat()
                })
                .collect::<Vec<_>>()
        };
        let before = snapshot(&mut engine);
        let report = engine
            .step(&[batch(2, 8, config.vocab_size, 2)], 1e-3)
            .unwrap();
        assert!(
            report.skipped && report.loss.is_nan(),
            "fused={fused}: {report:?}"
        );
        assert_eq!(
            engine.updates(),
            1,
            "fused={fused}: the skipped step counted as an update"
        );
        let after = snapshot(&mut engine);
        let same = before
            .iter()
            .zip(&after)
            .all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
        assert!(
            same,
            "fused={fused}: a skipped step changed parameters or optimizer state"
        );
    }
}

/// By default each group's update waits until the next step binds the group
/// (the CPU updates block i+2 while the device runs block i's forward). That
/// must not change a bit: the serialised engine updates at once after the
/// backward and is the reference. Reading one parameter between steps settles
/// only its group; a checkpoint-free sample (`last_logits`) settles the rest.
#[test]
fn deferred_updates_equal_immediate_ones_bit_for_bit() {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let model = config.init::<AD>(&device);
    let one_block_param = *values::<AD, _>(&model.blocks()[1], None)
        .keys()
        .next()
        .unwrap();
    let mut cfg = engine_config(false);
    cfg.grad_clip = Some(0.5);
    let model = model.valid();
    let mut deferred = Engine::new(model.clone(), cfg.clone(), &device).unwrap();
    // The same deferred updates with the optimizer not waiting for the
    // forward's weight copies (`hold_updates_for_copies: false`).
    let unheld_cfg = EngineConfig {
        hold_updates_for_copies: false,
        ..cfg.clone()
    };
    let mut unheld = Engine::new(model.clone(), unheld_cfg, &device).unwrap();
    cfg.overlap = false;
    let mut immediate = Engine::new(model, cfg, &device).unwrap();
    let groups = config.n_layer + 1;
    for step in 0..4u64 {
        let data = [batch(2, 8, config.vocab_size, 40 + step)];
        let a = deferred.step(&data, 1e-2).unwrap();
        let b = immediate.step(&data, 1e-2).unwrap();
        let c = unheld.step(&data, 1e-2).unwrap();
        assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "step {step}");
        assert_eq!(a.grad_norm.to_bits(), b.grad_norm.to_bits(), "step {step}");
        assert_eq!(c.loss.to_bits(), b.loss.to_bits(), "step {step}, unheld");
        assert_eq!(
            c.grad_norm.to_bits(),
            b.grad_norm.to_bits(),
            "step {step}, unheld"
        );
        assert_eq!(deferred.pending_groups(), groups, "step {step}");
        assert_eq!(immediate.pending_groups(), 0, "step {step}");
        if step == 1 {
            let got = deferred.param(&one_block_param).unwrap().to_vec();
            assert_eq!(deferred.pending_groups(), groups - 1);
            assert_eq!(got, immediate.param(&one_block_param).unwrap());
        }
    }
    let probe = batch(1, 4, config.vocab_size, 99).0;
    deferred.last_logits(&probe).unwrap();
    assert_eq!(
        deferred.pending_groups(),
        0,
        "the forward settles every group"
    );
    unheld.settle_all();
    let (a, b, c) = (
        deferred.into_store(),
        immediate.into_store(),
        unheld.into_store(),
    );
    for (g, (a, b)) in a.groups.iter().zip(&b.groups).enumerate() {
        assert!(
            c.groups[g].params.as_slice() == b.params.as_slice(),
            "group {g} params, unheld"
        );
        assert!(
            a.params.as_slice() == b.params.as_slice(),
            "group {g} params"
        );
        assert!(a.moments.bits_eq(&b.moments), "group {g} moments");
    }
}

/// A token id outside the vocabulary is a clear error, raised before the
/// forward touches the store: the stem's update deferred from the step
/// before is still applied whole by the next good step.
#[test]
fn a_token_outside_the_vocabulary_is_a_clear_error_and_changes_nothing() {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let vocab = config.vocab_size;
    let model = config.init::<AD>(&device).valid();
    let mut failed = Engine::new(model.clone(), engine_config(false), &device).unwrap();
    let mut clean = Engine::new(model, engine_config(false), &device).unwrap();
    let (first, second) = (batch(2, 8, vocab, 1), batch(2, 8, vocab, 2));
    for engine in [&mut failed, &mut clean] {
        engine.step(std::slice::from_ref(&first), 1e-2).unwrap();
    }
    let (inputs, targets) = batch(2, 8, vocab, 3);
    let mut ids: Vec<i64> = inputs.to_data().iter::<i64>().collect();
    ids[5] = vocab as i64;
    let inputs = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [2, 8]), &device);
    let err = failed.step(&[(inputs, targets)], 1e-2).unwrap_err();
    assert!(matches!(err, EngineError::Batch(_)), "{err}");
    assert!(
        err.to_string().contains(&format!(
            "token id {vocab} is outside the embedding table's {vocab} rows"
        )),
        "{err}"
    );
    for engine in [&mut failed, &mut clean] {
        engine.step(std::slice::from_ref(&second), 1e-2).unwrap();
    }
    let (a, b) = (failed.into_store(), clean.into_store());
    for (g, (a, b)) in a.groups.iter().zip(&b.groups).enumerate() {
        assert!(
            a.params.as_slice() == b.params.as_slice(),
            "group {g} params"
        );
        assert!(a.moments.bits_eq(&b.moments), "group {g} moments");
    }
}

/// Whatever reads the store whole (export, checkpoint, `store()`) sees every
/// deferred update applied.
#[test]
fn readers_of_the_store_settle_deferred_updates() {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let model = config.init::<AD>(&device).valid();
    let mut engine = Engine::new(model, engine_config(false), &device).unwrap();
    let before = engine.store().groups[2].params.as_slice().to_vec();
    let stem_before = engine.store().groups[0].params.as_slice().to_vec();
    engine
        .step(&[batch(2, 8, config.vocab_size, 5)], 1e-2)
        .unwrap();
    assert!(engine.pending_groups() > 0);
    let dir = tempfile::tempdir().unwrap();
    engine
        .save_checkpoint(
            &mut CheckpointDir::open(dir.path(), "test", 1).unwrap(),
            serde_json::Value::Null,
        )
        .unwrap();
    assert_eq!(engine.pending_groups(), 0);
    assert_ne!(engine.store().groups[2].params.as_slice(), &before[..]);
    // The stem's deferred update too: every slot (table and head) moved.
    let stem = &engine.store().groups[0];
    for slot in &stem.slots {
        let range = slot.offset..slot.offset + slot.len;
        assert_ne!(
            &stem.params.as_slice()[range.clone()],
            &stem_before[range],
            "stem slot {} not updated",
            slot.name
        );
    }
}

/// `data` with some targets ignored: every third position of the first row,
/// the first half of every other row.
fn with_ignored_targets(data: &Batch) -> Batch {
    let (rows, seq) = (data.1.dims()[0], data.1.dims()[1]);
    let mut targets = data.1.to_data().convert::<i64>().to_vec::<i64>().unwrap();
    for (i, t) in targets.iter_mut().enumerate() {
        let (row, pos) = (i / seq, i % seq);
        if (row == 0 && pos % 3 == 0) || (row > 0 && pos < seq / 2) {
            *t = burn_offload::ops::cross_entropy::IGNORE_INDEX;
        }
    }
    let targets = Tensor::from_data(TensorData::new(targets, [rows, seq]), &Default::default());
    (data.0.clone(), targets)
}

/// The mean loss over the kept targets alone, written with no notion of
/// ignoring: the kept rows of the logits are selected first.
fn loss_over_kept_rows(logits: Tensor<AD, 3>, targets: &Tensor<B, 2, Int>) -> Tensor<AD, 1> {
    let [batch, seq, vocab] = logits.dims();
    let targets = targets.to_data().convert::<i64>().to_vec::<i64>().unwrap();
    let kept: Vec<i64> = (0..targets.len() as i64)
        .filter(|&i| targets[i as usize] >= 0)
        .collect();
    let picked: Vec<i64> = kept.iter().map(|&i| targets[i as usize]).collect();
    let n = kept.len();
    let device = Default::default();
    let rows = logits
        .reshape([batch * seq, vocab])
        .select(0, Tensor::from_data(TensorData::new(kept, [n]), &device));
    burn::tensor::activation::log_softmax(rows, 1)
        .gather(
            1,
            Tensor::from_data(TensorData::new(picked, [n, 1]), &device),
        )
        .mean()
        .neg()
}

/// Ignored targets add exactly nothing: the engine's loss and gradients
/// (over two micro-batches with different numbers of kept targets) and the
/// resident loss equal the mean over the kept targets alone, and a fused
/// step equals a deferred one.
#[test]
fn ignored_targets_contribute_nothing_to_loss_and_gradients() {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let model = config.init::<AD>(&device);
    let parts = [
        with_ignored_targets(&batch(2, 16, config.vocab_size, 21)),
        with_ignored_targets(&batch(1, 16, config.vocab_size, 22)),
    ];
    // Reference: both micro-batches as one batch, kept rows only.
    let inputs = Tensor::cat(vec![parts[0].0.clone(), parts[1].0.clone()], 0);
    let targets = Tensor::cat(vec![parts[0].1.clone(), parts[1].1.clone()], 0);
    // Equal shapes are required of micro-batches: pad the second to two rows
    // of ignored targets.
    let pad = |b: &Batch| -> Batch {
        let ignored = Tensor::full(
            [1, 16],
            burn_offload::ops::cross_entropy::IGNORE_INDEX,
            &device,
        );
        (
            Tensor::cat(vec![b.0.clone(), b.0.clone()], 0),
            Tensor::cat(vec![b.1.clone(), ignored], 0),
        )
    };
    let micro = [parts[0].clone(), pad(&parts[1])];
    let reference =
        loss_over_kept_rows(model.forward(Tensor::from_inner(inputs.clone())), &targets);
    let want_loss = reference.clone().into_scalar();
    let grads = reference.backward();
    let want = values::<AD, _>(&model, Some(&grads));

    // Resident: the models' loss with the ignored targets in place.
    let resident = cross_entropy(
        model.forward(Tensor::from_inner(inputs)),
        Tensor::from_inner(targets),
    );
    let loss = resident.clone().into_scalar();
    assert!(
        (loss - want_loss).abs() <= TOL * want_loss,
        "resident loss {loss} vs {want_loss}"
    );
    let resident_grads = values::<AD, _>(&model, Some(&resident.backward()));
    for (id, reference) in &want {
        let err = rel_err(&resident_grads[id], reference);
        assert!(
            err <= TOL,
            "resident gradient of {id}: relative error {err}"
        );
    }

    // The engine, deferred mode, accumulating the two micro-batches.
    let mut engine = Engine::new(model.valid(), engine_config(false), &device).unwrap();
    let loss = engine.accumulate_gradients(&micro).unwrap();
    assert!(
        (loss - want_loss).abs() <= TOL * want_loss,
        "engine loss {loss} vs {want_loss}"
    );
    for (id, reference) in &want {
        let err = rel_err(&engine.grad(id).unwrap(), reference);
        assert!(err <= TOL, "engine gradient of {id}: relative error {err}");
    }

    // One micro-batch, fused against deferred: the same update.
    let mut deferred = Engine::new(model.valid(), engine_config(false), &device).unwrap();
    let mut fused = Engine::new(model.valid(), engine_config(true), &device).unwrap();
    let a = deferred.step(&micro[..1], 1e-2).unwrap();
    let b = fused.step(&micro[..1], 1e-2).unwrap();
    assert!(
        (a.loss - b.loss).abs() <= TOL * a.loss.abs(),
        "{} vs {}",
        a.loss,
        b.loss
    );
    for id in want.keys() {
        let reference = deferred.param(id).unwrap().to_vec();
        let err = rel_err(fused.param(id).unwrap(), &reference);
        assert!(err <= TOL, "fused parameter {id}: relative error {err}");
    }
}
