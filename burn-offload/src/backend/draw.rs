//! Random initial values drawn on the host, for `Offload` tensors created
//! by `random`: seeded by the backend's `seed`, in parallel chunks.

use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::{Distribution, FloatDType, Shape, TensorData};
use rayon::prelude::*;

static HOST_SEED: AtomicU64 = AtomicU64::new(0x5eed);
static HOST_DRAWS: AtomicU64 = AtomicU64::new(0);

pub(super) fn seed_host_rng(seed: u64) {
    HOST_SEED.store(seed, Ordering::Relaxed);
    HOST_DRAWS.store(0, Ordering::Relaxed);
}

/// How many random draws were taken since the seed: a recomputed block
/// rewinds to where its forward began, so it draws the same values.
pub(crate) fn host_draws() -> u64 {
    HOST_DRAWS.load(Ordering::Relaxed)
}

/// Sets the number of draws taken (see [`host_draws`]).
pub(crate) fn rewind_host_draws(position: u64) {
    HOST_DRAWS.store(position, Ordering::Relaxed);
}

/// Elements per independently seeded chunk of a random draw.
const DRAW_CHUNK: usize = 1 << 20;

/// Random host data, drawn in parallel: chunk `c` of draw `n` uses a generator
/// seeded from `(seed, n, c)`, so results depend only on the seed and the
/// order of draws, not on the thread count. Multi-billion-parameter models
/// initialise at memory bandwidth without touching the GPU.
pub(super) fn random_data(
    shape: Shape,
    distribution: Distribution,
    dtype: FloatDType,
) -> TensorData {
    use rand010::SeedableRng;
    let draw = HOST_DRAWS.fetch_add(1, Ordering::Relaxed);
    let seed = HOST_SEED.load(Ordering::Relaxed);
    let numel = shape.num_elements();
    let mut values = vec![0.0f32; numel];
    values
        .par_chunks_mut(DRAW_CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mix = seed
                ^ draw.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                ^ (c as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            let mut rng = rand010::rngs::StdRng::seed_from_u64(mix);
            let drawn = TensorData::random::<f32, _, _>([chunk.len()], distribution, &mut rng);
            chunk.copy_from_slice(drawn.as_slice::<f32>().expect("f32 draw"));
        });
    TensorData::new(values, shape).convert_dtype(dtype.into())
}
