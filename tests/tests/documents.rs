//! Packed windows with document boundaries against the same examples run
//! one per window: logits per example, loss and every parameter gradient,
//! through plain burn (`Autodiff<B>` on the whole model) and through the
//! engine; and the rotary positions that restart at each document.

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn_offload::ops::cross_entropy::IGNORE_INDEX;
use burn_offload::{BlockModel, Documents, Engine, EngineConfig};
use burn_offload_tests::{
    random_tokens, rel_err, values, TestAutodiff as AD, TestBackend as B, TOL,
};
use models::llama::{document_rope_tables, rope_tables};
use models::{cross_entropy, Gpt2Config, LlamaConfig};

/// Positions per window: not a multiple of the attention's query blocks
/// (`Tiling::new` cuts 14 into blocks of 4).
const SEQ: usize = 14;

/// Example lengths, packed greedily: [5, 3, 6 | 7, 1, 4 (+2 padding) | 9
/// (+5 padding)] (a one-token example trains on nothing, as an instruction
/// example cut to its prompt's first token).
const LENGTHS: [usize; 7] = [5, 3, 6, 7, 1, 4, 9];

/// Token rows: `(inputs, targets)` `[rows, SEQ]` of `examples`, each
/// example's targets its next tokens (its last none), the rest padding
/// (token 0, no target); with `packing` several examples a row and the
/// rows' document starts (the padding a document of its own).
fn windows(
    examples: &[Vec<i64>],
    packing: bool,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>, Documents) {
    let mut rows: Vec<(Vec<i64>, Vec<i64>, Vec<usize>)> = Vec::new();
    for example in examples {
        let fits = rows
            .last()
            .is_some_and(|(x, _, _)| packing && x.len() + example.len() <= SEQ);
        if !fits {
            rows.push((Vec::new(), Vec::new(), Vec::new()));
        }
        let (x, y, starts) = rows.last_mut().expect("a row");
        starts.push(x.len());
        x.extend_from_slice(example);
        y.extend(example[1..].iter().copied());
        y.push(IGNORE_INDEX);
    }
    let n = rows.len();
    let (mut inputs, mut targets, mut starts) = (Vec::new(), Vec::new(), Vec::new());
    for (mut x, mut y, mut s) in rows {
        if x.len() < SEQ {
            s.push(x.len());
        }
        x.resize(SEQ, 0);
        y.resize(SEQ, IGNORE_INDEX);
        inputs.extend(x);
        targets.extend(y);
        starts.push(s);
    }
    let device = Default::default();
    let tensor = |v: Vec<i64>| Tensor::from_data(TensorData::new(v, [n, SEQ]), &device);
    let documents = Documents::new(SEQ, starts).expect("valid starts");
    (tensor(inputs), tensor(targets), documents)
}

fn examples(vocab: usize, seed: u64) -> Vec<Vec<i64>> {
    LENGTHS
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let row = random_tokens::<B>(1, len, vocab, seed + i as u64, &Default::default());
            row.into_data()
                .convert::<i64>()
                .to_vec::<i64>()
                .expect("ids")
        })
        .collect()
}

/// The positions of each example, `(row, start, len)`, in `documents`
/// (the padding, a row's last document past the examples, left out).
fn placed(documents: &Documents) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut lengths = LENGTHS.iter();
    for row in 0..documents.batch() {
        let starts = documents.starts(row);
        for (i, &start) in starts.iter().enumerate() {
            let end = starts.get(i + 1).copied().unwrap_or(SEQ);
            match lengths.clone().next() {
                Some(&len)
                    if len == end - start || (i + 1 == starts.len() && len <= end - start) =>
                {
                    lengths.next();
                    out.push((row, start, len));
                }
                _ => {}
            }
        }
    }
    assert_eq!(
        out.len(),
        LENGTHS.len(),
        "every example placed: {documents:?}"
    );
    out
}

/// The models: Llama (grouped queries, 2 key/value heads for 4), Llama
/// with a sliding window shorter than some examples, GPT-2 (learned
/// positions).
fn llamas() -> Vec<(&'static str, LlamaConfig)> {
    vec![
        ("llama", LlamaConfig::tiny()),
        (
            "llama, window 4",
            LlamaConfig {
                sliding_window: Some(4),
                ..LlamaConfig::tiny()
            },
        ),
        (
            "llama, 4 query heads a key head",
            LlamaConfig {
                n_kv_head: 1,
                ..LlamaConfig::tiny()
            },
        ),
    ]
}

/// Each example's logits, packed with boundaries, are those it has alone in
/// a window: attention stays inside it and its positions start at 0.
fn check_logits<M: BlockModel<AD>>(model: &M, vocab: usize, what: &str) {
    let examples = examples(vocab, 3);
    let (packed_x, _, documents) = windows(&examples, true);
    let (alone_x, _, _) = windows(&examples, false);
    assert_eq!(packed_x.dims()[0], 3, "three packed windows");
    let lift = |t: Tensor<B, 2, Int>| Tensor::<AD, 2, Int>::from_inner(t);
    let packed = model.forward_in(lift(packed_x), &documents).inner();
    let alone = model.forward(lift(alone_x)).inner();
    for (e, (row, start, len)) in placed(&documents).into_iter().enumerate() {
        let got = packed.clone().slice([row..row + 1, start..start + len]);
        let want = alone.clone().slice([e..e + 1, 0..len]);
        let err = rel_err(
            &got.into_data().to_vec::<f32>().unwrap(),
            &want.into_data().to_vec::<f32>().unwrap(),
        );
        assert!(err <= TOL, "{what}: example {e}'s logits off by {err}");
    }
}

#[test]
fn packed_logits_are_each_examples_alone() {
    let device = Default::default();
    for (what, config) in llamas() {
        check_logits(&config.init::<AD>(&device), config.vocab_size, what);
    }
    let gpt2 = Gpt2Config::tiny();
    check_logits(&gpt2.init::<AD>(&device), gpt2.vocab_size, "gpt2");
}

/// Packed windows train as the same examples one per window: the loss (the
/// mean over the same trained targets) and every parameter's gradient,
/// through plain burn on the packed windows and through the engine,
/// against plain burn on one example a window.
fn check_training<M>(model: M, vocab: usize, what: &str)
where
    M: BlockModel<AD> + AutodiffModule<AD>,
    M::InnerModule: BlockModel<B> + burn::module::HasAutodiffModule<AD, TrainModule = M>,
    <M::InnerModule as BlockModel<B>>::Block: burn::module::HasAutodiffModule<AD>,
    <<M::InnerModule as BlockModel<B>>::Block as burn::module::HasAutodiffModule<AD>>::TrainModule:
        burn_offload::DecoderBlock<AD>,
{
    let examples = examples(vocab, 11);
    let (x, y, documents) = windows(&examples, true);
    let (alone_x, alone_y, _) = windows(&examples, false);
    let lift = |t: &Tensor<B, 2, Int>| Tensor::<AD, 2, Int>::from_inner(t.clone());
    let loss = cross_entropy(model.forward(lift(&alone_x)), lift(&alone_y));
    let want_loss: f32 = loss.clone().into_scalar().elem();
    let want = values::<AD, _>(&model, Some(&loss.backward()));

    let loss = cross_entropy(model.forward_in(lift(&x), &documents), lift(&y));
    let plain_loss: f32 = loss.clone().into_scalar().elem();
    let plain = values::<AD, _>(&model, Some(&loss.backward()));

    let config = EngineConfig {
        // Chunks of the head that cut across windows and examples.
        loss_chunk_tokens: 9,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(model.valid(), config, &Default::default()).unwrap();
    let engine_loss = engine
        .accumulate_gradients_in(&[(x.clone(), y.clone())], std::slice::from_ref(&documents))
        .unwrap();
    for (path, loss) in [("plain burn", plain_loss), ("engine", engine_loss)] {
        let err = ((loss - want_loss) / want_loss).abs();
        assert!(err <= TOL, "{what}, {path}: loss {loss}, alone {want_loss}");
    }
    for (id, reference) in &want {
        let streamed = engine.grad(id).unwrap().to_vec();
        for (path, grad) in [("plain burn", &plain[id]), ("engine", &streamed)] {
            let err = rel_err(grad, reference);
            assert!(err <= TOL, "{what}, {path}: gradient of {id} off by {err}");
        }
    }
}

#[test]
fn packed_windows_train_as_one_example_a_window() {
    let device = Default::default();
    for (what, config) in llamas() {
        check_training(config.init::<AD>(&device), config.vocab_size, what);
    }
    let gpt2 = Gpt2Config::tiny();
    check_training(gpt2.init::<AD>(&device), gpt2.vocab_size, "gpt2");
}

/// The engine refuses boundaries that are not one per micro-batch or not
/// of its shape.
#[test]
fn the_engine_checks_the_boundaries() {
    let config = LlamaConfig::tiny();
    let model = config.init::<B>(&Default::default());
    let mut engine = Engine::new(model, EngineConfig::default(), &Default::default()).unwrap();
    let (x, y, documents) = windows(&examples(config.vocab_size, 5), true);
    let err = engine
        .accumulate_gradients_in(&[(x.clone(), y.clone())], &[])
        .unwrap_err();
    assert!(
        err.to_string().contains("0 sets of document boundaries"),
        "{err}"
    );
    let other = Documents::whole(1, SEQ);
    let err = engine
        .accumulate_gradients_in(&[(x, y)], &[other])
        .unwrap_err();
    assert!(
        err.to_string().contains("micro-batch 0: documents"),
        "{err}"
    );
    drop(documents);
}

/// Rotary positions restart at each document: a packed row's tables at a
/// document's positions are the tables of positions 0, 1, … .
#[test]
fn rotary_positions_restart_at_each_document() {
    let device = Default::default();
    let inv_freqs = LlamaConfig::tiny().inv_freqs();
    let documents = Documents::new(9, vec![vec![0, 4], vec![0, 2, 3]]).unwrap();
    let (cos, sin) = document_rope_tables::<B>(&documents, &inv_freqs, &device);
    let (cos_0, sin_0) = rope_tables::<B>(9, &inv_freqs, &device);
    for row in 0..2 {
        let starts = documents.starts(row);
        for (i, &start) in starts.iter().enumerate() {
            let len = starts.get(i + 1).copied().unwrap_or(9) - start;
            for (got, want) in [(&cos, &cos_0), (&sin, &sin_0)] {
                let got = got.clone().slice([row..row + 1, start..start + len]);
                let want = want.clone().narrow(0, 0, len).unsqueeze::<3>();
                let diff: f32 = (got - want).abs().max().into_scalar();
                assert!(diff == 0.0, "row {row}, document at {start}: {diff}");
            }
        }
    }
}
