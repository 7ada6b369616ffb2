//! f32 → bf16 rounding on the host.

use burn::tensor::bf16;
use rayon::prelude::*;

/// Rounds `values` to bf16 (to nearest even) into `out` (same length).
pub fn round_into(out: &mut [bf16], values: &[f32]) {
    out.iter_mut()
        .zip(values)
        .for_each(|(o, v)| *o = bf16::from_f32(*v));
}

/// [`round_into`] in parallel (a block's gradient is hundreds of megabytes).
pub fn round_into_par(out: &mut [bf16], values: &[f32]) {
    out.par_chunks_mut(1 << 16)
        .zip(values.par_chunks(1 << 16))
        .for_each(|(o, v)| round_into(o, v));
}
