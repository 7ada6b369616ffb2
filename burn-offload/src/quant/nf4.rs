//! NormalFloat4 with double quantisation, as bitsandbytes and QLoRA define
//! it: the weight (flattened row-major) is cut into blocks of [`NF4_BLOCK`]
//! values, each scaled by its largest magnitude (`absmax`) and each value
//! stored as the index of the nearest of the 16 entries of [`NF4`], two
//! indices a byte (the first of a pair in the high nibble, as
//! `kQuantizeBlockwise` packs them). The f32 absmax values are quantised
//! again ("double quantisation"): offset by their mean, then blockwise in
//! blocks of [`QUANT_BLOCK`] with bitsandbytes' signed 8-bit dynamic map
//! ([`SIGNED`]), keeping one f32 scale per such block.

use rayon::prelude::*;

use super::error::QuantError;
use crate::host::optim::quant::{dequantize_block, quantize_block, QUANT_BLOCK, SIGNED};

/// Values per NF4 block (QLoRA's block size for weights).
pub const NF4_BLOCK: usize = 64;

/// The NormalFloat4 code, ascending, as bitsandbytes publishes it
/// (`get_4bit_type("nf4")` and the table of `dDequantizeNF4`), with its
/// published digits (each the exact decimal of an f32).
#[allow(clippy::excessive_precision)]
pub const NF4: [f32; 16] = [
    -1.0,
    -0.696_192_800_998_687_7,
    -0.525_073_051_452_636_7,
    -0.394_917_488_098_144_53,
    -0.284_441_381_692_886_35,
    -0.184_773_430_228_233_34,
    -0.091_050_036_251_544_95,
    0.0,
    0.079_580_299_556_255_34,
    0.160_930_201_411_247_25,
    0.246_112_301_945_686_34,
    0.337_915_241_718_292_24,
    0.440_709_829_330_444_34,
    0.562_617_003_917_694_1,
    0.722_956_836_223_602_3,
    1.0,
];

/// The 15 decision thresholds between consecutive codes, the f32 literals
/// of bitsandbytes' `dQuantizeNF4` decision tree (`csrc/kernels.cu`): the
/// midpoints of neighbouring entries, printed in decimal and rounded to f32
/// once as the CUDA compiler reads them (0.8614784181118011 rounds below the
/// exact midpoint of 0.7229568 and 1, which is a tie in f32). A normalised
/// value is coded as the number of thresholds it exceeds (`x > t`, so a
/// value exactly at a threshold takes the lower code, as the tree does).
#[allow(clippy::excessive_precision)]
pub const NF4_THRESHOLDS: [f32; 15] = [
    -0.8480964004993439,
    -0.6106329262256622,
    -0.4599952697753906,
    -0.33967943489551544,
    -0.23460740596055984,
    -0.13791173323988914,
    -0.045525018125772476,
    0.03979014977812767,
    0.1202552504837513,
    0.2035212516784668,
    0.2920137718319893,
    0.3893125355243683,
    0.5016634166240692,
    0.6427869200706482,
    0.8614784181118011,
];

/// The NF4 index (0..16) of the entry nearest to `x`, a value normalised to
/// [-1, 1] (values outside are clamped to the end codes).
#[inline]
pub fn nf4_code(x: f32) -> u8 {
    NF4_THRESHOLDS.iter().map(|&t| u8::from(x > t)).sum()
}

/// A `[out, in]` weight in NF4 with double-quantised absmax, in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Nf4Weight {
    /// The codes, two a byte: element `2k` in the high nibble of byte `k`,
    /// `2k + 1` in the low one (`ceil(numel / 2)` bytes; an odd count leaves
    /// the last low nibble 0).
    pub packed: Vec<u8>,
    /// Each [`NF4_BLOCK`]-block's absmax minus [`offset`](Self::offset), as
    /// an index into [`SIGNED`]'s entries (`ceil(numel / 64)` bytes).
    pub absmax_codes: Vec<u8>,
    /// The scale of each [`QUANT_BLOCK`] absmax codes (their largest
    /// magnitude after the offset).
    pub absmax_scales: Vec<f32>,
    /// The mean of the blocks' f32 absmax values, added back on dequantising.
    pub offset: f32,
    /// `[out, in]`.
    pub shape: [usize; 2],
}

impl Nf4Weight {
    /// The number of values.
    pub fn numel(&self) -> usize {
        self.shape[0] * self.shape[1]
    }

    /// The number of [`NF4_BLOCK`]-blocks.
    pub fn blocks(&self) -> usize {
        self.absmax_codes.len()
    }

    /// Host bytes this weight holds: the packed codes, the absmax codes,
    /// their scales and the offset.
    pub fn bytes(&self) -> usize {
        self.packed.len() + self.absmax_codes.len() + 4 * self.absmax_scales.len() + 4
    }

    /// The absmax of every [`NF4_BLOCK`]-block as dequantised from its code:
    /// `SIGNED[code] * scale + offset`, in f32, multiplication then addition
    /// (no fused multiply-add), in that order.
    pub fn absmax(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.absmax_codes.len()];
        for ((codes, o), &scale) in self
            .absmax_codes
            .chunks(QUANT_BLOCK)
            .zip(out.chunks_mut(QUANT_BLOCK))
            .zip(&self.absmax_scales)
        {
            dequantize_block(&SIGNED, codes, scale, o);
            for a in o.iter_mut() {
                *a += self.offset;
            }
        }
        out
    }

    /// Writes the dequantised weight, row-major, into `out` (`numel`
    /// values): each value is `NF4[code] * absmax` of its block, the
    /// absmax as [`absmax`](Self::absmax) gives it.
    pub fn dequantize_into(&self, out: &mut [f32]) -> Result<(), QuantError> {
        QuantError::check_length(out.len(), self.shape)?;
        let absmax = self.absmax();
        out.par_chunks_mut(NF4_BLOCK)
            .zip(self.packed.par_chunks(NF4_BLOCK / 2))
            .zip(absmax.par_iter())
            .for_each(|((o, bytes), &a)| {
                for (i, v) in o.iter_mut().enumerate() {
                    let byte = bytes[i / 2];
                    let code = if i % 2 == 0 { byte >> 4 } else { byte & 0x0f };
                    *v = NF4[code as usize] * a;
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

/// Quantises one block: its codes into `bytes` (`ceil(len / 2)` bytes);
/// returns its absmax. A block of zeros has absmax 0 and codes of 0.0 (7).
fn quantize_nf4_block(values: &[f32], bytes: &mut [u8]) -> f32 {
    let absmax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    // bitsandbytes multiplies by the reciprocal of the absmax.
    let inv = if absmax > 0.0 { 1.0 / absmax } else { 0.0 };
    for (pair, b) in values.chunks(2).zip(bytes.iter_mut()) {
        let hi = nf4_code(pair[0] * inv);
        // An odd tail's missing second value packs as nibble 0.
        let lo = pair.get(1).map_or(0, |v| nf4_code(v * inv));
        *b = (hi << 4) | lo;
    }
    absmax
}

/// Quantises a row-major `[out, in]` weight (`values.len() == out * in`) to
/// NF4 with double-quantised absmax. Blocks run over the flattened weight
/// (a block may span rows); the last may be shorter than [`NF4_BLOCK`].
/// The offset is the mean of the blocks' absmax values, summed in f64 and
/// rounded to f32 once. Non-finite inputs give unspecified codes.
pub fn quantize_nf4(values: &[f32], shape: [usize; 2]) -> Result<Nf4Weight, QuantError> {
    QuantError::check_length(values.len(), shape)?;
    let blocks = values.len().div_ceil(NF4_BLOCK);
    let mut packed = vec![0u8; values.len().div_ceil(2)];
    let mut absmax = vec![0.0f32; blocks];
    values
        .par_chunks(NF4_BLOCK)
        .zip(packed.par_chunks_mut(NF4_BLOCK / 2))
        .zip(absmax.par_iter_mut())
        .for_each(|((v, b), a)| *a = quantize_nf4_block(v, b));
    let offset = if blocks == 0 {
        0.0
    } else {
        (absmax.iter().map(|&a| a as f64).sum::<f64>() / blocks as f64) as f32
    };
    let centred: Vec<f32> = absmax.iter().map(|a| a - offset).collect();
    let mut absmax_codes = vec![0u8; blocks];
    let absmax_scales: Vec<f32> = centred
        .par_chunks(QUANT_BLOCK)
        .zip(absmax_codes.par_chunks_mut(QUANT_BLOCK))
        .map(|(v, c)| quantize_block(&SIGNED, v, c))
        .collect();
    Ok(Nf4Weight {
        packed,
        absmax_codes,
        absmax_scales,
        offset,
        shape,
    })
}

/// The largest gap between adjacent [`NF4`] entries (between -1 and
/// -0.696): half of it, times a block's absmax, bounds a value's error.
pub fn nf4_largest_gap() -> f32 {
    NF4.windows(2).map(|w| w[1] - w[0]).fold(0.0, f32::max)
}
