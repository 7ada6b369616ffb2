//! int8 weights with one absmax scale per output channel (row), the weight
//! quantisation of LLM.int8(): row `r` of a `[out, in]` weight keeps its
//! largest magnitude `s_r`, and each value `x` is stored as
//! `round(x * 127 / s_r)`, read back as `code * (s_r / 127)`.

use rayon::prelude::*;

use super::error::QuantError;

/// The largest code magnitude.
const LEVELS: f32 = 127.0;

/// A `[out, in]` weight in int8 with a scale per row, in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Weight {
    /// The codes, row-major, in [-127, 127].
    pub codes: Vec<i8>,
    /// Each row's absmax (`out` values; 0 for a row of zeros).
    pub scales: Vec<f32>,
    /// `[out, in]`.
    pub shape: [usize; 2],
}

/// The value of one code step of a row with absmax `scale`: `scale / 127`
/// in f32. Dequantising multiplies a code by it (host and device alike, so
/// both round the same way).
#[inline]
pub fn int8_step(scale: f32) -> f32 {
    scale / LEVELS
}

impl Int8Weight {
    /// The number of values.
    pub fn numel(&self) -> usize {
        self.shape[0] * self.shape[1]
    }

    /// Host bytes this weight holds: a byte a value and an f32 a row.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }

    /// Writes the dequantised weight, row-major, into `out` (`numel`
    /// values): `code as f32 * int8_step(scale)`.
    pub fn dequantize_into(&self, out: &mut [f32]) -> Result<(), QuantError> {
        QuantError::check_length(out.len(), self.shape)?;
        let cols = self.shape[1];
        if cols == 0 {
            return Ok(());
        }
        out.par_chunks_mut(cols)
            .zip(self.codes.par_chunks(cols))
            .zip(self.scales.par_iter())
            .for_each(|((o, codes), &s)| {
                let step = int8_step(s);
                for (v, &c) in o.iter_mut().zip(codes) {
                    *v = c as f32 * step;
                }
            });
        Ok(())
    }

    /// The dequantised weight, row-major (see [`dequantize_into`](Self::dequantize_into)).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.numel()];
        self.dequantize_into(&mut out)
            .expect("the output has the weight's length");
        out
    }
}

/// Quantises a row-major `[out, in]` weight (`values.len() == out * in`) to
/// int8 with a scale per row: `round(x * 127 / s)` (half away from zero),
/// clamped to [-127, 127]; a row of zeros has scale 0 and codes 0.
/// Non-finite inputs give unspecified codes.
pub fn quantize_int8(values: &[f32], shape: [usize; 2]) -> Result<Int8Weight, QuantError> {
    QuantError::check_length(values.len(), shape)?;
    let [rows, cols] = shape;
    let mut codes = vec![0i8; values.len()];
    let mut scales = vec![0.0f32; rows];
    if cols > 0 {
        values
            .par_chunks(cols)
            .zip(codes.par_chunks_mut(cols))
            .zip(scales.par_iter_mut())
            .for_each(|((v, c), s)| {
                let absmax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                *s = absmax;
                if absmax > 0.0 {
                    for (code, &x) in c.iter_mut().zip(v) {
                        *code = (x * LEVELS / absmax).round().clamp(-LEVELS, LEVELS) as i8;
                    }
                }
            });
    }
    Ok(Int8Weight {
        codes,
        scales,
        shape,
    })
}
