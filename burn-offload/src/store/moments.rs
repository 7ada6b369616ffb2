//! A group's optimizer moments: f32, or 8-bit blockwise
//! (`host::optim::quant`, bitsandbytes' scheme).

use std::borrow::Cow;

use crate::host::optim::quant::{DynamicMap, QUANT_BLOCK, SIGNED, UNSIGNED};
use crate::host::optim::MomentSlices;
use crate::host::slab::Slab;

/// Both moments of some values, as f32 (borrowed, or dequantised).
pub type MomentValues<'a> = (Cow<'a, [f32]>, Cow<'a, [f32]>);

/// Adam's two moments of one group (SGD keeps its momentum in the first).
pub enum Moments {
    /// 4 bytes a value each.
    F32 {
        /// First moment.
        m: Slab,
        /// Second moment.
        v: Slab,
    },
    /// A byte a value each, and a scale per block of [`QUANT_BLOCK`].
    Q8 {
        /// First moment (signed map).
        m: Q8Slab,
        /// Second moment (unsigned map).
        v: Q8Slab,
    },
}

/// Blockwise 8-bit values: a code per value, the largest magnitude of each
/// block of [`QUANT_BLOCK`] as its scale. A block whose scale is 0 holds zeros.
pub struct Q8Slab {
    /// One code per value (an index into the moment's dynamic map).
    pub codes: Vec<u8>,
    /// One scale per block.
    pub absmax: Vec<f32>,
}

impl Q8Slab {
    /// `len` zeros.
    pub fn zeros(len: usize) -> Self {
        Self {
            codes: vec![0; len],
            absmax: vec![0.0; len.div_ceil(QUANT_BLOCK)],
        }
    }

    /// Bytes it occupies.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.absmax.len()
    }

    /// The values in `range`, dequantised with `map`.
    pub fn values(&self, map: &DynamicMap, range: std::ops::Range<usize>) -> Vec<f32> {
        range
            .map(|i| map.values[self.codes[i] as usize] * self.absmax[i / QUANT_BLOCK])
            .collect()
    }
}

impl Moments {
    /// `len` zeros of each moment, 8-bit with `eight_bit`.
    pub fn zeros(len: usize, eight_bit: bool) -> Self {
        if eight_bit {
            Moments::Q8 {
                m: Q8Slab::zeros(len),
                v: Q8Slab::zeros(len),
            }
        } else {
            Moments::F32 {
                m: Slab::zeros(len),
                v: Slab::zeros(len),
            }
        }
    }

    /// Empty moments of the same kind (what a lent group keeps).
    pub(crate) fn empty_like(&self) -> Self {
        Self::zeros(0, self.is_eight_bit())
    }

    /// Whether they are 8-bit.
    pub fn is_eight_bit(&self) -> bool {
        matches!(self, Moments::Q8 { .. })
    }

    /// Bytes both occupy.
    pub fn bytes(&self) -> usize {
        match self {
            Moments::F32 { m, v } => m.bytes() + v.bytes(),
            Moments::Q8 { m, v } => m.bytes() + v.bytes(),
        }
    }

    /// What an update writes.
    pub fn slices(&mut self) -> MomentSlices<'_> {
        match self {
            Moments::F32 { m, v } => MomentSlices::F32 {
                m: m.as_mut_slice(),
                v: v.as_mut_slice(),
            },
            Moments::Q8 { m, v } => MomentSlices::Q8 {
                m: &mut m.codes,
                m_absmax: &mut m.absmax,
                v: &mut v.codes,
                v_absmax: &mut v.absmax,
            },
        }
    }

    /// Both moments of the values in `range`, as f32 (dequantised when 8-bit).
    pub fn values(&self, range: std::ops::Range<usize>) -> MomentValues<'_> {
        match self {
            Moments::F32 { m, v } => (
                Cow::Borrowed(&m.as_slice()[range.clone()]),
                Cow::Borrowed(&v.as_slice()[range]),
            ),
            Moments::Q8 { m, v } => (
                Cow::Owned(m.values(&SIGNED, range.clone())),
                Cow::Owned(v.values(&UNSIGNED, range)),
            ),
        }
    }

    /// The f32 moments, `None` when 8-bit.
    pub fn f32(&self) -> Option<(&[f32], &[f32])> {
        match self {
            Moments::F32 { m, v } => Some((m.as_slice(), v.as_slice())),
            Moments::Q8 { .. } => None,
        }
    }

    /// Whether both hold the same bits (same kind, codes, scales, values).
    pub fn bits_eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Moments::F32 { m, v }, Moments::F32 { m: m2, v: v2 }) => {
                bits(m.as_slice()) == bits(m2.as_slice())
                    && bits(v.as_slice()) == bits(v2.as_slice())
            }
            (Moments::Q8 { m, v }, Moments::Q8 { m: m2, v: v2 }) => {
                m.codes == m2.codes
                    && v.codes == v2.codes
                    && bits(&m.absmax) == bits(&m2.absmax)
                    && bits(&v.absmax) == bits(&v2.absmax)
            }
            _ => false,
        }
    }
}

fn bits(x: &[f32]) -> &[u32] {
    bytemuck::cast_slice(x)
}
