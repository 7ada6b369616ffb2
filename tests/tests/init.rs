//! Building the engine from a lazily initialised model, and sampling through it.
//!
//! One test in its own binary: it seeds burn's process-wide RNG and compares
//! two draws, which a concurrent test drawing weights would interleave.

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn_offload::{BlockModel, Engine, EngineConfig};
use burn_offload_tests::{max_rel_err, random_tokens, TestBackend as B};
use models::LlamaConfig;

/// Every float parameter's values, in visit order.
struct Ordered(Vec<Vec<f32>>);

impl<X: Backend> ModuleVisitor<X> for Ordered {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<X, D>>) {
        self.0
            .push(param.val().into_data().convert::<f32>().to_vec().unwrap());
    }
}

fn ordered<X: Backend, M: Module<X>>(model: &M) -> Vec<Vec<f32>> {
    let mut out = Ordered(Vec::new());
    model.visit(&mut out);
    out.0
}

#[test]
fn lazy_weights_go_straight_to_the_store_and_sampling_streams_the_blocks() {
    let device = Default::default();
    let config = LlamaConfig {
        n_layer: 3,
        ..LlamaConfig::tiny()
    };

    // Drawn whole, as a plain burn model would be.
    B::seed(&device, 11);
    let whole = config.init::<B>(&device);
    let want = ordered(&whole);

    // Left lazy: the engine draws one tensor at a time into its store.
    B::seed(&device, 11);
    let lazy = config.init::<B>(&device);
    let mut engine = Engine::new(lazy, EngineConfig::default(), &device).unwrap();
    let got = ordered(&engine.model());
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "parameter {i} differs from the whole-model draw");
    }
    assert_eq!(
        engine.store().num_params(),
        want.iter().map(Vec::len).sum::<usize>()
    );

    // Streamed last-position logits equal the whole model's.
    let tokens = random_tokens::<B>(2, 7, config.vocab_size, 3, &device);
    let streamed = engine.last_logits(&tokens).unwrap();
    let full = whole
        .forward(tokens)
        .narrow(1, 6, 1)
        .reshape([2, config.vocab_size]);
    let err = max_rel_err(streamed, full, 1e-3);
    assert!(err < 1e-4, "streamed logits differ by {err}");

    // An empty input is an error, not a panic.
    let empty = Tensor::<B, 2, Int>::zeros([1, 0], &device);
    assert!(engine.last_logits(&empty).is_err());
}
