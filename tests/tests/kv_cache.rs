//! The key/value cache: a cached forward's logits are the whole sequence's
//! forward's at its last position, for a prompt run at once, a prompt run
//! in pieces, each token one at a time, after the cache grows and after it
//! is cut back; for each Llama variant (grouped-query heads, a sliding
//! window shorter than the sequence, Qwen2's biases, Qwen3's q/k norms) and
//! GPT-2; and greedy generation through the cache is generation through
//! the whole forward, token for token.

use burn::prelude::*;
use burn::tensor::TensorData;
use burn_offload::BlockModel;
use burn_offload_tests::{max_rel_err, random_tokens, TestBackend as B};
use models::llama::AttentionBias;
use models::{CachedModel, Gpt2Config, KvCache, LlamaConfig};
use trainer::generate::{generate, Cached, Ended, Recompute, Request, Stops};
use trainer::sampling::{Sampler, Sampling};
use trainer::tokenizer::Tokenizer;

/// Logits at the last position of `ids` by the plain forward, `[1, vocab]`.
fn full<M: BlockModel<B>>(model: &M, ids: &[i64]) -> Tensor<B, 2> {
    let device = Default::default();
    let tokens =
        Tensor::<B, 2, Int>::from_data(TensorData::new(ids.to_vec(), [1, ids.len()]), &device);
    let logits = model.forward(tokens);
    let [_, seq, vocab] = logits.dims();
    logits.narrow(1, seq - 1, 1).reshape([1, vocab])
}

fn feed<M: CachedModel<B>>(model: &M, cache: &mut KvCache<B>, ids: &[i64]) -> Tensor<B, 2> {
    let device = Default::default();
    let tokens =
        Tensor::<B, 2, Int>::from_data(TensorData::new(ids.to_vec(), [1, ids.len()]), &device);
    model.forward_cached(tokens, cache)
}

/// Every way of filling the cache gives the plain forward's logits.
fn check<M: CachedModel<B>>(model: &M, vocab: usize, what: &str) {
    let device = Default::default();
    let ids: Vec<i64> = random_tokens::<B>(1, 40, vocab, 3, &device)
        .into_data()
        .convert::<i64>()
        .to_vec()
        .unwrap();
    let close = |a: Tensor<B, 2>, b: Tensor<B, 2>, at: &str| {
        let err = max_rel_err(a, b, 1e-2);
        assert!(err < 1e-4, "{what}, {at}: relative error {err}");
    };
    // A prompt of 24 at once (room for 8: the cache grows twice), then one
    // token at a time.
    let mut cache = model.new_cache(8);
    close(
        feed(model, &mut cache, &ids[..24]),
        full(model, &ids[..24]),
        "prefill",
    );
    for end in 25..=ids.len() {
        let at = format!("decode to {end}");
        close(
            feed(model, &mut cache, &ids[end - 1..end]),
            full(model, &ids[..end]),
            &at,
        );
    }
    assert_eq!(cache.len(), ids.len());
    // A second turn: a piece of several tokens after the cached ones.
    let mut cache = model.new_cache(64);
    feed(model, &mut cache, &ids[..10]);
    close(
        feed(model, &mut cache, &ids[10..31]),
        full(model, &ids[..31]),
        "pieces",
    );
    // Cut back to 17 positions and continue with other tokens.
    cache.truncate(17);
    let mut other = ids[..17].to_vec();
    other.extend([1, 2, 3, 4, 5]);
    close(
        feed(model, &mut cache, &other[17..]),
        full(model, &other),
        "truncated",
    );
}

fn llama(edit: impl FnOnce(&mut LlamaConfig)) -> LlamaConfig {
    let mut config = LlamaConfig::tiny();
    edit(&mut config);
    config.validate().unwrap();
    config
}

#[test]
fn cached_forward_matches_the_whole_forward_llama() {
    let device = Default::default();
    let cases = [
        ("llama (grouped-query heads)", llama(|_| {})),
        (
            "mistral (window of 6)",
            llama(|c| c.sliding_window = Some(6)),
        ),
        (
            "qwen2 (biases)",
            llama(|c| c.attention_bias = AttentionBias::Qkv),
        ),
        (
            "qwen3 (q/k norms, own head size)",
            llama(|c| {
                c.qk_norm = true;
                c.head_dim = Some(8);
            }),
        ),
    ];
    for (what, config) in cases {
        B::seed(&device, 5);
        let model = config.init::<B>(&device);
        check(&model, config.vocab_size, what);
    }
}

#[test]
fn cached_forward_matches_the_whole_forward_gpt2() {
    let device = Default::default();
    B::seed(&device, 5);
    let config = Gpt2Config::tiny();
    let model = config.init::<B>(&device);
    check(&model, config.vocab_size, "gpt2");
}

/// Greedy generation of 64 tokens with `model` through its cache and through
/// a forward over the whole context per token.
fn generate_both<M: CachedModel<B> + Clone>(model: &M, tokenizer: &Tokenizer) -> [Vec<u32>; 2] {
    let device = Default::default();
    let prompt: Vec<u32> = tokenizer.encode("The ");
    let stops = Stops::default();
    let request = Request {
        prompt: &prompt,
        max_new_tokens: 64,
        stops: &stops,
        slide: false,
    };
    let greedy = || Sampler::new(Sampling::default());
    // Draws the lazily initialised weights once, before the model is cloned.
    let ids: Vec<i64> = prompt.iter().map(|&t| t as i64).collect();
    full(model, &ids);
    let mut cached = Cached::new(model.clone(), 16, 256, &device);
    let with_cache = generate(&mut cached, &mut greedy(), tokenizer, &request, |_| {}).unwrap();
    let mut recomputed = Recompute::new(
        |tokens| Ok::<_, ()>(full_logits(model, tokens)),
        256,
        &device,
    );
    let without = generate(&mut recomputed, &mut greedy(), tokenizer, &request, |_| {}).unwrap();
    assert_eq!(with_cache.ended, Ended::Length);
    [with_cache.ids, without.ids]
}

fn full_logits<M: BlockModel<B>>(model: &M, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
    let logits = model.forward(tokens);
    let [_, seq, vocab] = logits.dims();
    logits.narrow(1, seq - 1, 1).reshape([1, vocab])
}

/// Acceptance (issue 52): generation with the cache is generation without
/// it, token for token: greedy, 64 tokens, a tiny Llama and GPT-2.
#[test]
fn greedy_generation_with_the_cache_is_the_recomputed_one() {
    let device = Default::default();
    let tokenizer = Tokenizer::Byte;
    B::seed(&device, 11);
    let llama = LlamaConfig::tiny().init::<B>(&device);
    let [cached, recomputed] = generate_both(&llama, &tokenizer);
    assert_eq!(cached.len(), 64);
    assert_eq!(cached, recomputed, "llama");
    B::seed(&device, 11);
    let gpt2 = Gpt2Config::tiny().init::<B>(&device);
    let [cached, recomputed] = generate_both(&gpt2, &tokenizer);
    assert_eq!(cached.len(), 64);
    assert_eq!(cached, recomputed, "gpt2");
}
