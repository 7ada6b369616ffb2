//! What the block-streamed engine refuses and how it fails: invalid
//! configs, misuse, a block that breaks the contract, non-finite steps and
//! tokens outside the vocabulary, each a clear error that changes nothing.

mod engine_common;

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn_offload::{
    AdamWConfig, BatchError, ConfigError, Engine, EngineConfig, EngineError, OptimizerConfig,
    OptimizerError,
};
use burn_offload_tests::{batch, TestAutodiff as AD, TestBackend as B};
use engine_common::engine_config;
use models::LlamaConfig;

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
