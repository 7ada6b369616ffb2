//! Text generated from the trained model (the sample after training), by
//! the generation `chat` runs ([`crate::generate`]).

use burn::prelude::*;
use burn_offload::{BlockModel, DecoderBlock};

use crate::generate::{generate, Recompute, Request, Stops};
use crate::sampling::{Sampler, Sampling};
use crate::tokenizer::Tokenizer;

/// How the sample after training is drawn.
#[derive(Debug, Clone, Copy)]
pub struct SampleSettings {
    /// Tokens to generate (0: no sample).
    pub tokens: usize,
    /// The trained window: the context goes on from its last half when full.
    pub seq_len: usize,
    /// 0 is greedy.
    pub temperature: f64,
    pub seed: u64,
}

/// The prompt and what `last_logits` (the last position's logits of a
/// batch of one, `[1, vocab]`, from a forward over the whole context)
/// generates after it, as text: up to `settings.tokens` tokens, ending at
/// the tokenizer's end-of-sequence token. Empty when no token is asked
/// for. Fails with `last_logits`' first error.
pub fn sample<B: Backend, E>(
    last_logits: impl FnMut(Tensor<B, 2, Int>) -> Result<Tensor<B, 2>, E>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    settings: SampleSettings,
    device: &B::Device,
) -> Result<String, E> {
    if settings.tokens == 0 {
        return Ok(String::new());
    }
    let mut decoder = Recompute::new(last_logits, settings.seq_len, device);
    let mut sampler = Sampler::new(Sampling {
        temperature: settings.temperature,
        seed: settings.seed,
        ..Sampling::default()
    });
    let stops = Stops {
        ids: tokenizer.specials().eos.map(|s| s.id).into_iter().collect(),
        strings: Vec::new(),
    };
    let request = Request {
        prompt,
        max_new_tokens: settings.tokens,
        stops: &stops,
        slide: true,
    };
    let reply = generate(&mut decoder, &mut sampler, tokenizer, &request, |_| {})?;
    Ok(tokenizer.decode(prompt) + &reply.text)
}

/// Logits at the last position of each sequence of a resident model, `[batch, vocab]`.
pub fn last_logits<B: Backend, M: BlockModel<B>>(
    model: &M,
    tokens: Tensor<B, 2, Int>,
) -> Tensor<B, 2> {
    let [batch, seq] = tokens.dims();
    let hidden = model
        .blocks()
        .iter()
        .fold(model.embed(tokens), |x, b| b.forward(x));
    let logits = model.head(hidden.narrow(1, seq - 1, 1));
    let vocab = logits.dims()[2];
    logits.reshape([batch, vocab])
}
