//! A quantised weight whose code bytes live apart from it: in a frozen
//! base's page-aligned slab, which can be page-locked for uploads (a
//! `Vec` per weight is not page-aligned, and its copies to the GPU ran as
//! pageable memory at a fraction of the bus).

use super::int8::Int8Weight;
use super::nf4::Nf4Weight;

/// A quantised weight: its scales and shape (whose own code vectors are
/// empty) and its code bytes.
#[derive(Clone, Copy, Debug)]
pub enum QuantizedRef<'a> {
    /// int8 with an absmax per row.
    Int8 {
        /// Scales and shape.
        weight: &'a Int8Weight,
        /// The codes, a byte each (`i8` as `u8`).
        codes: &'a [u8],
    },
    /// NF4 with double-quantised absmax.
    Nf4 {
        /// Scales, offset and shape.
        weight: &'a Nf4Weight,
        /// The packed nibbles.
        packed: &'a [u8],
        /// The blocks' absmax codes.
        absmax_codes: &'a [u8],
    },
}

impl QuantizedRef<'_> {
    /// The int8 weight whole, codes included (a copy).
    pub fn int8(&self) -> Option<Int8Weight> {
        match *self {
            QuantizedRef::Int8 { weight, codes } => Some(Int8Weight {
                codes: bytemuck::cast_slice(codes).to_vec(),
                ..weight.clone()
            }),
            QuantizedRef::Nf4 { .. } => None,
        }
    }

    /// The NF4 weight whole, codes included (a copy).
    pub fn nf4(&self) -> Option<Nf4Weight> {
        match *self {
            QuantizedRef::Nf4 {
                weight,
                packed,
                absmax_codes,
            } => Some(Nf4Weight {
                packed: packed.to_vec(),
                absmax_codes: absmax_codes.to_vec(),
                ..weight.clone()
            }),
            QuantizedRef::Int8 { .. } => None,
        }
    }

    /// The weight's `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        match *self {
            QuantizedRef::Int8 { weight, .. } => weight.shape,
            QuantizedRef::Nf4 { weight, .. } => weight.shape,
        }
    }

    /// The dequantised values, row-major `[out, in]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let int8 = self.int8().map(|w| w.dequantize());
        int8.or_else(|| self.nf4().map(|w| w.dequantize()))
            .unwrap_or_default()
    }
}
