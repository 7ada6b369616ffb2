//! Model structure: shapes, causality, RoPE, grouped-query attention.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::{Distribution, TensorData};
use burn_offload::{BlockModel, DecoderBlock};
use burn_offload_tests::{max_rel_err, random_tokens, TestBackend as B};
use models::llama::{apply_rope, cached_rope_tables, rope_tables, LlamaAttention};
use models::{Gpt2Config, LlamaConfig};

fn check_shapes_and_causality<M: BlockModel<B>>(model: &M, vocab: usize) {
    let device = Default::default();
    let (batch, seq) = (2, 12);
    let tokens = random_tokens::<B>(batch, seq, vocab, 1, &device);
    let logits = model.forward(tokens.clone());
    assert_eq!(logits.dims(), [batch, seq, vocab]);

    // Changing token t+1 must leave the logits at positions <= t unchanged.
    let t = 5;
    let mut ids = tokens.into_data().convert::<i64>().to_vec::<i64>().unwrap();
    for row in 0..batch {
        ids[row * seq + t + 1] = (ids[row * seq + t + 1] + 7) % vocab as i64;
    }
    let changed = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, seq]), &device);
    let logits_changed = model.forward(changed);
    let prefix = |l: Tensor<B, 3>| l.narrow(1, 0, t + 1);
    assert!(max_rel_err(prefix(logits_changed.clone()), prefix(logits.clone()), 1e-3) < 1e-5);
    // ...and the future does change (the test can fail).
    let suffix = |l: Tensor<B, 3>| l.narrow(1, t + 1, seq - t - 1);
    assert!(max_rel_err(suffix(logits_changed), suffix(logits), 1e-3) > 1e-3);
}

#[test]
fn gpt2_forward_shapes_and_causality() {
    let config = Gpt2Config::tiny();
    let model = config.init::<B>(&Default::default());
    assert_eq!(model.num_params(), config.num_params());
    check_shapes_and_causality(&model, config.vocab_size);
}

#[test]
fn llama_forward_shapes_and_causality() {
    let config = LlamaConfig::tiny();
    let model = config.init::<B>(&Default::default());
    assert_eq!(model.num_params(), config.num_params());
    check_shapes_and_causality(&model, config.vocab_size);
}

/// Unscaled rotary frequencies `θ^(-2j/head_dim)`.
fn freqs(head_dim: usize, theta: f64) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|j| theta.powf(-2.0 * j as f64 / head_dim as f64))
        .collect()
}

#[test]
fn cached_rope_tables_are_the_tables_built_for_that_length() {
    let device = Default::default();
    let values = |(cos, sin): (Tensor<B, 2>, Tensor<B, 2>)| {
        assert_eq!(cos.dims(), sin.dims());
        (
            cos.dims(),
            cos.into_data().to_vec::<f32>().unwrap(),
            sin.into_data().to_vec::<f32>().unwrap(),
        )
    };
    // A head size and θ no other test uses: this test sees the cache empty
    // for them. Shorter after longer (narrowed), longer (rebuilt), exact
    // powers of two, and a second θ beside the first.
    let head_dim = 6;
    for (seq, theta) in [
        (7, 500.0),
        (3, 500.0),
        (8, 500.0),
        (21, 500.0),
        (5, 500.0),
        (5, 900.0),
        (21, 500.0),
    ] {
        let got = values(cached_rope_tables::<B>(
            seq,
            &freqs(head_dim, theta),
            &device,
        ));
        let want = values(rope_tables::<B>(seq, &freqs(head_dim, theta), &device));
        assert_eq!(got, want, "seq {seq}, θ {theta}");
    }
}

#[test]
fn rope_matches_the_direct_formula() {
    let device = Default::default();
    let (batch, heads, seq, head_dim, theta) = (2, 3, 7, 8, 10_000.0f64);
    let x = Tensor::<B, 4>::random(
        [batch, heads, seq, head_dim],
        Distribution::Normal(0.0, 1.0),
        &device,
    );
    let (cos, sin) = rope_tables::<B>(seq, &freqs(head_dim, theta), &device);
    let got = apply_rope(x.clone(), &cos, &sin)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let x = x.into_data().to_vec::<f32>().unwrap();

    // Pair (i, i + half) at position t is rotated by angle t · θ^(-2i/head_dim).
    let half = head_dim / 2;
    let at = |b: usize, h: usize, t: usize, j: usize| ((b * heads + h) * seq + t) * head_dim + j;
    for b in 0..batch {
        for h in 0..heads {
            for t in 0..seq {
                for i in 0..half {
                    let angle = t as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
                    let (c, s) = (angle.cos(), angle.sin());
                    let (x1, x2) = (x[at(b, h, t, i)] as f64, x[at(b, h, t, i + half)] as f64);
                    let want = [x1 * c - x2 * s, x2 * c + x1 * s];
                    let have = [
                        got[at(b, h, t, i)] as f64,
                        got[at(b, h, t, i + half)] as f64,
                    ];
                    for k in 0..2 {
                        assert!(
                            (want[k] - have[k]).abs() < 1e-5,
                            "b{b} h{h} t{t} i{i}: {want:?} vs {have:?}"
                        );
                    }
                }
            }
        }
    }
}

/// Plain multi-head causal attention written out: softmax(q kᵀ/√d + mask) v, per head.
fn reference_mha(attn: &LlamaAttention<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let [batch, seq, d] = x.dims();
    let head_dim = d / attn.n_head;
    let split = |t: Tensor<B, 3>| {
        t.reshape([batch, seq, attn.n_head, head_dim])
            .swap_dims(1, 2)
    };
    let (cos, sin) = rope_tables::<B>(seq, &attn.inv_freqs, &x.device());
    let q = apply_rope(split(attn.q_proj.forward(x.clone())), &cos, &sin);
    let k = apply_rope(split(attn.k_proj.forward(x.clone())), &cos, &sin);
    let v = split(attn.v_proj.forward(x));
    let scores = q.matmul(k.swap_dims(2, 3)) / (head_dim as f64).sqrt();
    let future = Tensor::<B, 2, Bool>::tril_mask([seq, seq], 0, &scores.device()).unsqueeze::<4>();
    let scores = scores.mask_fill(
        future.expand([batch, attn.n_head, seq, seq]),
        f32::NEG_INFINITY,
    );
    let y = burn::tensor::activation::softmax(scores, 3).matmul(v);
    attn.o_proj
        .forward(y.swap_dims(1, 2).reshape([batch, seq, d]))
}

#[test]
fn attention_with_kv_heads_equal_to_heads_is_plain_multi_head_attention() {
    let device = Default::default();
    let config = LlamaConfig {
        n_kv_head: 4,
        ..LlamaConfig::tiny()
    };
    let model = config.init::<B>(&device);
    let x = Tensor::<B, 3>::random(
        [2, 9, config.d_model],
        Distribution::Normal(0.0, 1.0),
        &device,
    );
    let attn = &model.layers[0].attn;
    let err = max_rel_err(attn.forward(x.clone()), reference_mha(attn, x), 1e-3);
    assert!(err < 1e-5, "max relative error {err}");
}

#[test]
fn grouped_query_attention_equals_multi_head_with_repeated_kv_weights() {
    let device = Default::default();
    let config = LlamaConfig::tiny(); // 4 query heads share 2 key/value heads
    assert!(config.n_kv_head < config.n_head);
    let gqa = config.init::<B>(&device).layers.remove(0).attn;
    let groups = config.n_head / config.n_kv_head;
    let head_dim = config.head_dim();

    // burn parameters initialise lazily: run the module once so the clone below
    // shares the same (materialised) weights instead of drawing its own.
    let x = Tensor::<B, 3>::random(
        [2, 9, config.d_model],
        Distribution::Normal(0.0, 1.0),
        &device,
    );
    let gqa_out = gqa.forward(x.clone());

    // Expand k/v projections [d, kv·hd] → [d, heads·hd]: query head h reads kv head h / groups.
    let repeat_heads = |w: Tensor<B, 2>| {
        let columns = (0..config.n_head)
            .map(|h| w.clone().narrow(1, (h / groups) * head_dim, head_dim))
            .collect();
        Tensor::cat(columns, 1)
    };
    let mut mha = gqa.clone();
    mha.n_kv_head = config.n_head;
    mha.k_proj.weight = Param::from_tensor(repeat_heads(gqa.k_proj.weight.val()));
    mha.v_proj.weight = Param::from_tensor(repeat_heads(gqa.v_proj.weight.val()));

    let err = max_rel_err(gqa_out.clone(), reference_mha(&mha, x.clone()), 1e-3);
    assert!(err < 1e-5, "max relative error {err}");
    let err = max_rel_err(gqa_out, mha.forward(x), 1e-3);
    assert!(err < 1e-5, "max relative error {err}");
}

#[test]
fn blocks_preserve_the_hidden_shape() {
    let device = Default::default();
    let model = LlamaConfig::tiny().init::<B>(&device);
    let x = Tensor::<B, 3>::random([1, 5, 64], Distribution::Normal(0.0, 1.0), &device);
    for block in model.blocks() {
        assert_eq!(block.forward(x.clone()).dims(), [1, 5, 64]);
    }
}
