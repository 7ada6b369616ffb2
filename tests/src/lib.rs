//! Shared helpers for the integration tests.

use burn::prelude::*;
use burn::tensor::TensorData;

/// The backend the tests run on: the CPU one, or CUDA with `--features cuda`
/// (the GPU parity run).
#[cfg(not(feature = "cuda"))]
pub type TestBackend = burn::backend::Flex;
#[cfg(feature = "cuda")]
pub type TestBackend = burn::backend::Cuda;
pub type TestAutodiff = burn::backend::Autodiff<TestBackend>;

/// Random token ids `[batch, seq]` in `0..vocab`, from a seeded generator.
pub fn random_tokens<B: Backend>(
    batch: usize,
    seq: usize,
    vocab: usize,
    seed: u64,
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let ids: Vec<i64> = (0..batch * seq)
        .map(|_| rng.random_range(0..vocab as i64))
        .collect();
    Tensor::from_data(TensorData::new(ids, [batch, seq]), device)
}

/// Largest `|a - b| / max(|b|, floor)` over two tensors of the same shape.
pub fn max_rel_err<B: Backend, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
    floor: f32,
) -> f32 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let a = a.into_data().convert::<f32>().to_vec::<f32>().unwrap();
    let b = b.into_data().convert::<f32>().to_vec::<f32>().unwrap();
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(floor))
        .fold(0.0, f32::max)
}
