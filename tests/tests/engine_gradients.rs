//! The block-streamed engine's gradients against plain burn (`Autodiff<B>`
//! on the whole model) on random weights and tokens: every family, tiled
//! MLPs, tied heads, accumulated micro-batches and ignored targets.
//!
//! Relative error of a tensor: `‖engine − reference‖₂ / ‖reference‖₂` (normwise).

mod engine_common;

use burn::module::{AutodiffModule, Module};
use burn::prelude::*;
use burn_offload::{BlockModel, Engine, EngineConfig};
use burn_offload_tests::{
    batch, lift, rel_err, values, Batch, TestAutodiff as AD, TestBackend as B, TOL,
};
use engine_common::{engine_config, slot_count};
use models::{cross_entropy, Gpt2Config, LlamaConfig};

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

    // Block inputs in host memory, on the device, or the last recomputed
    // blocks' on the device and the others' in host memory (on a CPU
    // backend all are the same memory; the GPU run of this test covers the
    // paths), and
    // none, one or every block's forward graph kept instead of recomputed
    // (more than there are blocks means all), and the recomputed blocks'
    // attention outputs kept from the forward, the last one's or every
    // one's (which the recompute must then take in place of its own, each
    // block its own: the count of those it took grows).
    let cases = [
        (0, 0, 0),
        (usize::MAX, 0, 0),
        (0, 1, 0),
        (usize::MAX, 99, 0),
        (0, 0, 99),
        (usize::MAX, 1, 99),
        (0, 0, 1),
        (usize::MAX, 1, 1),
        (1, 0, 0),
        (2, 1, 1),
    ];
    for (device_checkpoints, kept_graphs, kept_attention) in cases {
        let config = EngineConfig {
            device_checkpoints,
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
                "gradient of {id} (checkpoints on the device: {device_checkpoints}, kept graphs: {kept_graphs}, kept attention: {kept_attention}): relative error {err}"
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
