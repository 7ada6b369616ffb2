//! Text generated from the trained model (the sample after training).

use burn::prelude::*;
use burn::tensor::TensorData;
use burn_offload::{BlockModel, DecoderBlock};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Continues a short prompt with the trained model: greedy at temperature 0,
/// otherwise sampled (seeded). The window slides over the last `seq_len` tokens.
/// Fails with `last_logits`' first error.
pub fn generate<B: Backend, E>(
    mut last_logits: impl FnMut(Tensor<B, 2, Int>) -> Result<Tensor<B, 2>, E>,
    prompt: &[u32],
    new_tokens: usize,
    seq_len: usize,
    temperature: f64,
    seed: u64,
    device: &B::Device,
) -> Result<Vec<u32>, E> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ids = prompt.to_vec();
    for _ in 0..new_tokens {
        let window = &ids[ids.len().saturating_sub(seq_len)..];
        let input: Vec<i64> = window.iter().map(|&t| t as i64).collect();
        let tokens =
            Tensor::<B, 2, Int>::from_data(TensorData::new(input, [1, window.len()]), device);
        let logits: Vec<f32> = last_logits(tokens)?
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap_or_default();
        ids.push(pick_token(&logits, temperature, &mut rng));
    }
    Ok(ids)
}

/// Logits at the last position of each sequence of a resident model, `[batch, vocab]`.
pub(crate) fn last_logits<B: Backend, M: BlockModel<B>>(
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

pub(crate) fn pick_token(logits: &[f32], temperature: f64, rng: &mut StdRng) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &l)| {
                if l > best.1 {
                    (i, l)
                } else {
                    best
                }
            })
            .0 as u32
    };
    if temperature == 0.0 {
        return argmax();
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let weights: Vec<f64> = logits
        .iter()
        .map(|&l| ((l as f64 - max) / temperature).exp())
        .collect();
    let mut draw = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (i, w) in weights.iter().enumerate() {
        draw -= w;
        if draw <= 0.0 {
            return i as u32;
        }
    }
    argmax()
}
