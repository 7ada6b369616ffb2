//! f32 → bf16 rounding on the host.

use burn::tensor::bf16;

/// Rounds `values` to bf16 (to nearest even) into `out` (same length).
pub fn round_into(out: &mut [bf16], values: &[f32]) {
    out.iter_mut()
        .zip(values)
        .for_each(|(o, v)| *o = bf16::from_f32(*v));
}
