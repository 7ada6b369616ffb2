//! Text generation: a prompt through a [`Decoder`] (prefill), then one
//! token at a time (decode), each chosen by a [`Sampler`], until a stop
//! token, a stop string, the token budget or the model's context; the text
//! is handed on as it grows. `chat` and the sample after training both run
//! [`generate`].
//!
//! A [`Cached`] decoder keeps a [`KvCache`] beside a resident model: the
//! prompt runs once and each token is one position. A [`Streamed`] decoder
//! does the same with a model in the engine's host store, whose blocks
//! visit the device one at a time for every forward, as in training (a
//! model larger than the device). A [`Recompute`] decoder runs a forward
//! over the whole context for each token (the sample after training, and a
//! check of the cache).
//!
//! Per token the host waits for the device once: for the chosen id when
//! greedy (the device takes the argmax), else for the last position's
//! logits, which the sampler reads.

use std::convert::Infallible;
use std::time::Instant;

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use burn_offload::{Engine, EngineError, StreamedModel};
use models::{CachedBlock, CachedModel, KvCache};

use crate::sampling::Sampler;
use crate::tokenizer::Tokenizer;

/// What generation needs of a model: the logits that follow a context it
/// extends.
pub trait Decoder<B: Backend> {
    type Error;

    /// Appends `tokens` to the context and returns the logits of the
    /// position after them, `[1, vocab]`.
    fn feed(&mut self, tokens: &[u32]) -> Result<Tensor<B, 2>, Self::Error>;

    /// The context so far.
    fn ids(&self) -> &[u32];

    /// Forgets the context from position `len` on.
    fn truncate(&mut self, len: usize);

    /// The most positions the context may hold.
    fn context(&self) -> usize;
}

/// A resident model with its key/value cache.
pub struct Cached<B: Backend, M: CachedModel<B>> {
    model: M,
    cache: KvCache<B>,
    ids: Vec<u32>,
    context: usize,
    device: B::Device,
}

impl<B: Backend, M: CachedModel<B>> Cached<B, M> {
    /// `model` on `device` with an empty cache allocated for `capacity`
    /// positions (it grows to `context`, the most the model takes).
    pub fn new(model: M, capacity: usize, context: usize, device: &B::Device) -> Self {
        Self {
            cache: model.new_cache(capacity.min(context)),
            model,
            ids: Vec::new(),
            context,
            device: device.clone(),
        }
    }
}

impl<B: Backend, M: CachedModel<B>> Decoder<B> for Cached<B, M> {
    type Error = Infallible;

    fn feed(&mut self, tokens: &[u32]) -> Result<Tensor<B, 2>, Infallible> {
        self.ids.extend_from_slice(tokens);
        let tokens = id_tensor::<B>(tokens, &self.device);
        Ok(self.model.forward_cached(tokens, &mut self.cache))
    }

    fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn truncate(&mut self, len: usize) {
        self.ids.truncate(len);
        self.cache.truncate(len);
    }

    fn context(&self) -> usize {
        self.context
    }
}

/// A model in the engine's host store with its key/value cache on the
/// device: each forward streams the blocks through the device, as training's
/// does, for the new positions only.
pub struct Streamed<B: Backend, M: StreamedModel<B>> {
    engine: Engine<B, M>,
    cache: KvCache<B>,
    ids: Vec<u32>,
    context: usize,
    device: B::Device,
}

impl<B: Backend, M: StreamedModel<B> + CachedModel<B>> Streamed<B, M> {
    /// `engine`'s model with an empty cache allocated for `capacity`
    /// positions (it grows to `context`, the most the model takes).
    pub fn new(mut engine: Engine<B, M>, capacity: usize, context: usize) -> Self {
        let blocks = engine.store().num_blocks();
        let device = engine.devices()[0].clone();
        Self {
            engine,
            cache: KvCache::new(blocks, capacity.min(context)),
            ids: Vec::new(),
            context,
            device,
        }
    }
}

impl<B: Backend, M: StreamedModel<B> + CachedModel<B>> Decoder<B> for Streamed<B, M> {
    type Error = EngineError;

    fn feed(&mut self, tokens: &[u32]) -> Result<Tensor<B, 2>, EngineError> {
        let start = self.cache.len();
        let layers = self.cache.layers_mut();
        let logits = self.engine.last_logits_with(
            &id_tensor::<B>(tokens, &self.device),
            |model, tokens| model.embed_at(tokens, start),
            |i, block, x| block.forward_cached(x, &mut layers[i], start),
        )?;
        self.cache.advance(tokens.len());
        self.ids.extend_from_slice(tokens);
        Ok(logits)
    }

    fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn truncate(&mut self, len: usize) {
        self.ids.truncate(len);
        self.cache.truncate(len);
    }

    fn context(&self) -> usize {
        self.context
    }
}

/// A forward over the whole context per token: `forward` takes the ids
/// `[1, len]` and gives the last position's logits `[1, vocab]`.
pub struct Recompute<B: Backend, F> {
    forward: F,
    ids: Vec<u32>,
    context: usize,
    device: B::Device,
}

impl<B: Backend, F> Recompute<B, F> {
    pub fn new(forward: F, context: usize, device: &B::Device) -> Self {
        Self {
            forward,
            ids: Vec::new(),
            context,
            device: device.clone(),
        }
    }
}

impl<B: Backend, E, F> Decoder<B> for Recompute<B, F>
where
    F: FnMut(Tensor<B, 2, Int>) -> Result<Tensor<B, 2>, E>,
{
    type Error = E;

    fn feed(&mut self, tokens: &[u32]) -> Result<Tensor<B, 2>, E> {
        self.ids.extend_from_slice(tokens);
        (self.forward)(id_tensor::<B>(&self.ids, &self.device))
    }

    fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn truncate(&mut self, len: usize) {
        self.ids.truncate(len);
    }

    fn context(&self) -> usize {
        self.context
    }
}

fn id_tensor<B: Backend>(ids: &[u32], device: &B::Device) -> Tensor<B, 2, Int> {
    let values: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    Tensor::from_data(TensorData::new(values, [1, ids.len()]), device)
}

/// What ends a reply besides its length.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stops {
    /// Tokens that end it (end of sequence, end of turn); not part of it.
    pub ids: Vec<u32>,
    /// Text that ends it; the reply stops before it.
    pub strings: Vec<String>,
}

/// What [`generate`] is asked.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub prompt: &'a [u32],
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    pub stops: &'a Stops,
    /// When the context is full: go on from its last half, run again
    /// (the sample after training), instead of stopping.
    pub slide: bool,
}

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// A stop token (not in the reply).
    StopToken(u32),
    /// A stop string (the reply ends before it).
    StopString,
    /// `max_new_tokens` tokens.
    Length,
    /// The model's context is full.
    Context,
}

/// A reply and how long it took.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The tokens chosen, a stop token last where one ended the reply.
    pub ids: Vec<u32>,
    pub text: String,
    pub ended: Ended,
    /// Prompt tokens the prefill ran (those the decoder did not hold).
    pub prefilled: usize,
    /// From the start to the first token chosen.
    pub prefill_s: f64,
    /// From the first token chosen to the last.
    pub decode_s: f64,
}

impl Generation {
    /// Tokens a second after the first (each one forward of one position).
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.ids.len().saturating_sub(1) as f64 / self.decode_s.max(1e-9)
    }

    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prefilled as f64 / self.prefill_s.max(1e-9)
    }
}

/// Generates a reply to `request.prompt` with `decoder`, which keeps what
/// it holds of the prompt already (a conversation's earlier turns) and runs
/// the rest; `on_text` gets the reply's text as it grows, piece by piece
/// (held back where it may be the start of a stop string or of a character).
pub fn generate<B: Backend, D: Decoder<B>>(
    decoder: &mut D,
    sampler: &mut Sampler,
    tokenizer: &Tokenizer,
    request: &Request<'_>,
    mut on_text: impl FnMut(&str),
) -> Result<Generation, D::Error> {
    let started = Instant::now();
    let context = decoder.context();
    let mut prompt = request.prompt;
    if prompt.len() >= context && request.slide {
        prompt = &prompt[prompt.len() - context / 2..];
    }
    let mut out = Generation {
        ids: Vec::new(),
        text: String::new(),
        ended: Ended::Length,
        prefilled: 0,
        prefill_s: 0.0,
        decode_s: 0.0,
    };
    if prompt.is_empty() || prompt.len() >= context || request.max_new_tokens == 0 {
        out.ended = if request.max_new_tokens == 0 || prompt.is_empty() {
            Ended::Length
        } else {
            Ended::Context
        };
        return Ok(out);
    }
    // What the decoder holds of the prompt is kept, less one position: the
    // last prompt token's logits are needed.
    let held = decoder
        .ids()
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len() - 1);
    decoder.truncate(held);
    out.prefilled = prompt.len() - held;
    let mut logits = decoder.feed(&prompt[held..])?;
    let mut emitted = 0;
    let mut first_at = None;
    loop {
        let id = choose(logits, sampler, decoder.ids());
        let now = Instant::now();
        let first = *first_at.get_or_insert(now);
        out.prefill_s = (first - started).as_secs_f64();
        out.decode_s = (now - first).as_secs_f64();
        out.ids.push(id);
        if request.stops.ids.contains(&id) {
            out.ended = Ended::StopToken(id);
            break;
        }
        out.text = tokenizer.decode(&out.ids);
        if let Some(at) = request
            .stops
            .strings
            .iter()
            .filter_map(|s| out.text.find(s.as_str()))
            .min()
        {
            out.text.truncate(at);
            out.ended = Ended::StopString;
            break;
        }
        let ready = out.text.len() - held_back(&out.text, &request.stops.strings);
        if ready > emitted {
            on_text(&out.text[emitted..ready]);
            emitted = ready;
        }
        if out.ids.len() == request.max_new_tokens {
            break;
        }
        logits = if decoder.ids().len() < context {
            decoder.feed(&[id])?
        } else if request.slide {
            let mut tail = decoder.ids()[decoder.ids().len() + 1 - context / 2..].to_vec();
            tail.push(id);
            decoder.truncate(0);
            decoder.feed(&tail)?
        } else {
            out.ended = Ended::Context;
            break;
        };
    }
    if out.text.len() > emitted {
        on_text(&out.text[emitted..]);
    }
    Ok(out)
}

/// The next token from the last position's `logits`: the device's argmax
/// when greedy (only the id is read), else the sampler's choice.
fn choose<B: Backend>(logits: Tensor<B, 2>, sampler: &mut Sampler, context: &[u32]) -> u32 {
    if sampler.sampling().is_greedy() {
        let id: i64 = logits.argmax(1).into_scalar().elem();
        return id as u32;
    }
    let mut values: Vec<f32> = logits
        .cast(DType::F32)
        .into_data()
        .to_vec()
        .unwrap_or_default();
    sampler.pick(&mut values, context)
}

/// Bytes at the end of `text` that must wait for the next token: an
/// unfinished character (decoded as U+FFFD), or the start of a stop string.
fn held_back(text: &str, stops: &[String]) -> usize {
    let unfinished = text.len() - text.trim_end_matches('\u{FFFD}').len();
    let stop = stops
        .iter()
        .flat_map(|s| {
            (1..s.len())
                .filter(|&k| s.is_char_boundary(k) && text.ends_with(&s[..k]))
                .max()
        })
        .max()
        .unwrap_or(0);
    unfinished.max(stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_back_text_is_an_unfinished_character_or_a_stop_strings_start() {
        let stops = ["</s>".to_string(), "\nUser:".to_string()];
        assert_eq!(held_back("Hello", &stops), 0);
        assert_eq!(held_back("Hello</", &stops), 2);
        assert_eq!(held_back("Hello\nUs", &stops), 3);
        assert_eq!(held_back("Hello\u{FFFD}", &stops), 3);
    }
}
