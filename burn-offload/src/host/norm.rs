//! Gradient norms and global-norm clipping.

use rayon::prelude::*;

use super::optim::{GradSlice, CHUNK};

/// Sum of squares of a slice, in f64 (parallel; the global gradient norm is
/// the square root of the sum over all groups).
pub fn sum_of_squares(x: &[f32]) -> f64 {
    x.par_chunks(CHUNK)
        .map(|c| c.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>())
        .sum()
}

/// [`sum_of_squares`] of a gradient held as f32 or bf16 (the same sum for
/// bf16 values as for the same values widened to f32).
pub fn grad_sum_of_squares(x: GradSlice<'_>) -> f64 {
    match x {
        GradSlice::F32(x) => sum_of_squares(x),
        GradSlice::Bf16(x) => x
            .par_chunks(CHUNK)
            .map(|c| c.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>())
            .sum(),
    }
}

/// The squared norm of `x` outside `range`, as two sums (before it, then
/// after it: an empty range at 0 gives exactly `sum_of_squares(x)`).
pub fn sum_of_squares_outside(x: &[f32], range: std::ops::Range<usize>) -> f64 {
    sum_of_squares(&x[..range.start]) + sum_of_squares(&x[range.end..])
}

/// `(norm, scale)`: gradients are multiplied by `clip / norm` when the norm
/// exceeds `clip` (no clipping: `None`, scale 1).
pub fn clip_scale(norm: f64, clip: Option<f64>) -> (f64, f64) {
    let scale = match clip {
        Some(clip) if norm > clip => clip / norm,
        _ => 1.0,
    };
    (norm, scale)
}
