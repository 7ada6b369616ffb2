//! A group's frozen parameters (LoRA's base): kept in host memory in the
//! format asked, with no gradient and no optimizer state, and turned into
//! device tensors of the compute dtype when their group is bound.

use std::collections::HashSet;

use burn::module::ParamId;
use burn::tensor::bf16;
use rayon::prelude::*;

use crate::host::bf16::round_into_par;
use crate::host::slab::{Bf16Slab, Slab};
use crate::quant::{
    quantize_int8, quantize_nf4, BaseDtype, Int8Weight, Nf4Weight, QuantizedRef, NF4_BLOCK,
};

/// How frozen parameters are held in host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrozenDtype {
    /// f32, as the trained parameters (4 bytes a value; the device sees
    /// exactly the values it was given).
    F32,
    /// A base format: bf16 for every frozen parameter, or the blocks'
    /// weight matrices in int8 or NF4 (norms, biases and the stem's
    /// embedding and head stay bf16, as QLoRA leaves them).
    Base(BaseDtype),
}

impl FrozenDtype {
    /// Host bytes of one frozen parameter of `shape`, in a block's group
    /// (`block`) or the stem's (what the planner budgets with).
    pub fn host_bytes(self, shape: &[usize], block: bool) -> usize {
        let numel: usize = shape.iter().product();
        match self.format(shape, block) {
            Format::F32 => 4 * numel,
            Format::Bf16 => 2 * numel,
            Format::Int8 => BaseDtype::Int8.host_bytes(matrix(shape)),
            Format::Nf4 => BaseDtype::Nf4.host_bytes(matrix(shape)),
        }
    }

    /// The dtype's name: `f32`, or the base format's.
    pub fn name(self) -> &'static str {
        match self {
            FrozenDtype::F32 => "f32",
            FrozenDtype::Base(base) => base.name(),
        }
    }

    /// How one frozen parameter of `shape` is held, in a block's group
    /// (`block`) or the stem's.
    fn format(self, shape: &[usize], block: bool) -> Format {
        match self {
            FrozenDtype::F32 => Format::F32,
            FrozenDtype::Base(BaseDtype::Int8) if block && shape.len() == 2 => Format::Int8,
            FrozenDtype::Base(BaseDtype::Nf4) if block && shape.len() == 2 => Format::Nf4,
            FrozenDtype::Base(_) => Format::Bf16,
        }
    }
}

/// The parameters a store keeps frozen, and their host format.
#[derive(Clone, Debug)]
pub struct Frozen {
    /// The frozen parameters' ids (in the model given to the store).
    pub ids: HashSet<ParamId>,
    /// How they are held.
    pub dtype: FrozenDtype,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    F32,
    Bf16,
    Int8,
    Nf4,
}

/// Where one frozen parameter's values are.
#[derive(Clone, Debug, PartialEq)]
pub enum FrozenAt {
    /// A range of the group's f32 slab.
    F32(std::ops::Range<usize>),
    /// A range of the group's bf16 slab.
    Bf16(std::ops::Range<usize>),
    /// Entry `index` of the group's int8 weights (quantised transposed, see
    /// [`FrozenParams::fill`]), its codes at `codes` in the codes slab.
    Int8 {
        /// Its entry in [`FrozenParams::int8`].
        index: usize,
        /// Its codes' bytes in [`FrozenParams::codes`].
        codes: std::ops::Range<usize>,
    },
    /// Entry `index` of the group's NF4 weights (likewise), its packed
    /// nibbles and absmax codes in the codes slab.
    Nf4 {
        /// Its entry in [`FrozenParams::nf4`].
        index: usize,
        /// Its packed nibbles' bytes in [`FrozenParams::codes`].
        packed: std::ops::Range<usize>,
        /// Its absmax codes' bytes in [`FrozenParams::codes`].
        absmax_codes: std::ops::Range<usize>,
    },
}

/// One frozen parameter: its module path, shape and place.
#[derive(Clone, Debug, PartialEq)]
pub struct FrozenSlot {
    /// Module path, e.g. `attn.q_proj.weight`.
    pub name: String,
    /// The parameter's shape.
    pub shape: Vec<usize>,
    /// Where its values are.
    pub at: FrozenAt,
}

/// A group's frozen parameters, in visit order among themselves.
#[derive(Default)]
pub struct FrozenParams {
    /// Their places.
    pub slots: Vec<FrozenSlot>,
    /// Values held in f32 (page-aligned, so they can be page-locked).
    pub f32: Option<Slab>,
    /// Values held in bf16 (page-aligned).
    pub bf16: Option<Bf16Slab>,
    /// The quantised weights' code bytes, page-aligned (each weight's
    /// pieces start 16 bytes apart at least), so they can be page-locked.
    pub codes: Option<Slab>,
    /// Weights held in int8 (their codes in [`FrozenParams::codes`]).
    pub int8: Vec<Int8Weight>,
    /// Weights held in NF4 (their packed nibbles and absmax codes in
    /// [`FrozenParams::codes`]).
    pub nf4: Vec<Nf4Weight>,
}

/// The next range of `len` bytes from `*at`, which then moves past it to
/// the next multiple of 16.
fn take(at: &mut usize, len: usize) -> std::ops::Range<usize> {
    let range = *at..*at + len;
    *at = range.end.next_multiple_of(16);
    range
}

/// The values of one frozen parameter, as held.
pub enum FrozenValues<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values.
    Bf16(&'a [bf16]),
    /// A quantised weight (int8 or NF4).
    Quantized(QuantizedRef<'a>),
}

impl FrozenParams {
    /// Empty slabs for `params` (`(name, shape)` in visit order) held in
    /// `dtype`; [`FrozenParams::fill`] then writes each one's values.
    pub(crate) fn layout(params: &[(String, Vec<usize>)], dtype: FrozenDtype, block: bool) -> Self {
        let (mut f32_len, mut bf16_len) = (0, 0);
        let (mut int8, mut nf4) = (0, 0);
        let mut code_bytes = 0;
        let mut slots = Vec::with_capacity(params.len());
        for (name, shape) in params {
            let len: usize = shape.iter().product();
            let at = match dtype.format(shape, block) {
                Format::F32 => {
                    f32_len += len;
                    FrozenAt::F32(f32_len - len..f32_len)
                }
                Format::Bf16 => {
                    bf16_len += len;
                    FrozenAt::Bf16(bf16_len - len..bf16_len)
                }
                Format::Int8 => {
                    int8 += 1;
                    FrozenAt::Int8 {
                        index: int8 - 1,
                        codes: take(&mut code_bytes, len),
                    }
                }
                Format::Nf4 => {
                    nf4 += 1;
                    FrozenAt::Nf4 {
                        index: nf4 - 1,
                        packed: take(&mut code_bytes, len.div_ceil(2)),
                        absmax_codes: take(&mut code_bytes, len.div_ceil(NF4_BLOCK)),
                    }
                }
            };
            slots.push(FrozenSlot {
                name: name.clone(),
                shape: shape.clone(),
                at,
            });
        }
        Self {
            slots,
            f32: (f32_len > 0).then(|| Slab::zeros(f32_len)),
            bf16: (bf16_len > 0).then(|| Bf16Slab::zeros(bf16_len)),
            codes: (code_bytes > 0).then(|| Slab::zeros(code_bytes.div_ceil(4))),
            int8: Vec::with_capacity(int8),
            nf4: Vec::with_capacity(nf4),
        }
    }

    /// Writes slot `k`'s values, given in f32: copied, rounded to bf16 or
    /// quantised. A block's weight matrix, a linear layer's `[in, out]`, is
    /// quantised as its transpose `[out, in]`: the layout Hugging Face holds
    /// and bitsandbytes quantises (int8's absmax is then per output
    /// channel); the device transposes it back. Quantised slots must be
    /// filled in order.
    pub(crate) fn fill(&mut self, k: usize, values: &[f32]) {
        let slot = &self.slots[k];
        let shape = slot.shape.clone();
        match slot.at.clone() {
            FrozenAt::F32(range) => {
                let slab = self.f32.as_mut().expect("laid out with an f32 slab");
                slab.as_mut_slice()[range].copy_from_slice(values);
            }
            FrozenAt::Bf16(range) => {
                let slab = self.bf16.as_mut().expect("laid out with a bf16 slab");
                round_into_par(&mut slab.as_mut_slice()[range], values);
            }
            FrozenAt::Int8 { index, codes } => {
                assert_eq!(index, self.int8.len(), "int8 weights filled out of order");
                let (t, held) = transposed(values, &shape);
                let mut w = quantize_int8(&t, held).expect("laid out for its shape");
                self.code_bytes_mut(codes)
                    .copy_from_slice(bytemuck::cast_slice(&std::mem::take(&mut w.codes)));
                self.int8.push(w);
            }
            FrozenAt::Nf4 {
                index,
                packed,
                absmax_codes,
            } => {
                assert_eq!(index, self.nf4.len(), "NF4 weights filled out of order");
                let (t, held) = transposed(values, &shape);
                let mut w = quantize_nf4(&t, held).expect("laid out for its shape");
                self.code_bytes_mut(packed)
                    .copy_from_slice(&std::mem::take(&mut w.packed));
                self.code_bytes_mut(absmax_codes)
                    .copy_from_slice(&std::mem::take(&mut w.absmax_codes));
                self.nf4.push(w);
            }
        }
    }

    /// Slot `k`'s values as held.
    pub fn values(&self, k: usize) -> FrozenValues<'_> {
        match &self.slots[k].at {
            FrozenAt::F32(range) => {
                FrozenValues::F32(&self.f32.as_ref().expect("f32 slab").as_slice()[range.clone()])
            }
            FrozenAt::Bf16(range) => FrozenValues::Bf16(
                &self.bf16.as_ref().expect("bf16 slab").as_slice()[range.clone()],
            ),
            FrozenAt::Int8 { index, codes } => FrozenValues::Quantized(QuantizedRef::Int8 {
                weight: &self.int8[*index],
                codes: self.code_bytes(codes.clone()),
            }),
            FrozenAt::Nf4 {
                index,
                packed,
                absmax_codes,
            } => FrozenValues::Quantized(QuantizedRef::Nf4 {
                weight: &self.nf4[*index],
                packed: self.code_bytes(packed.clone()),
                absmax_codes: self.code_bytes(absmax_codes.clone()),
            }),
        }
    }

    /// Slot `k`'s values widened to f32 (dequantised where quantised).
    pub fn to_f32(&self, k: usize) -> Vec<f32> {
        match self.values(k) {
            FrozenValues::F32(v) => v.to_vec(),
            FrozenValues::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
            FrozenValues::Quantized(w) => transposed(&w.dequantize(), &w.shape()).0,
        }
    }

    /// The page-aligned slabs' bytes (values and codes), for page-locking.
    pub fn slab_bytes(&self) -> impl Iterator<Item = &[u8]> {
        let f32 = self
            .f32
            .iter()
            .map(|s| bytemuck::cast_slice::<f32, u8>(s.as_slice()));
        let bf16 = self
            .bf16
            .iter()
            .map(|s| bytemuck::cast_slice::<bf16, u8>(s.as_slice()));
        let codes = self
            .codes
            .iter()
            .map(|s| bytemuck::cast_slice::<f32, u8>(s.as_slice()));
        f32.chain(bf16).chain(codes)
    }

    /// The bytes of `range` in the codes slab.
    fn code_bytes(&self, range: std::ops::Range<usize>) -> &[u8] {
        let slab = self.codes.as_ref().expect("laid out with a codes slab");
        &bytemuck::cast_slice::<f32, u8>(slab.as_slice())[range]
    }

    /// [`FrozenParams::code_bytes`], to write.
    fn code_bytes_mut(&mut self, range: std::ops::Range<usize>) -> &mut [u8] {
        let slab = self.codes.as_mut().expect("laid out with a codes slab");
        &mut bytemuck::cast_slice_mut::<f32, u8>(slab.as_mut_slice())[range]
    }

    /// Host bytes held.
    pub fn bytes(&self) -> usize {
        self.f32.as_ref().map_or(0, Slab::bytes)
            + self.bf16.as_ref().map_or(0, Bf16Slab::bytes)
            + self.codes.as_ref().map_or(0, Slab::bytes)
            // Without their codes: the scales.
            + self.int8.iter().map(Int8Weight::bytes).sum::<usize>()
            + self.nf4.iter().map(Nf4Weight::bytes).sum::<usize>()
    }

    /// Number of frozen values.
    pub fn numel(&self) -> usize {
        self.slots
            .iter()
            .map(|s| s.shape.iter().product::<usize>())
            .sum()
    }
}

/// A quantised matrix's shape as held: `[out, in]` of a layer's `[in, out]`.
fn matrix(shape: &[usize]) -> [usize; 2] {
    [shape[1], shape[0]]
}

/// The transpose of a row-major `[rows, cols]` matrix, and its shape
/// `[cols, rows]`: in parallel, by bands of output rows, each reading its
/// band of every input row (a 70B model's matrices take seconds one
/// element at a time on one core).
fn transposed(values: &[f32], shape: &[usize]) -> (Vec<f32>, [usize; 2]) {
    const BAND: usize = 64;
    let (rows, cols) = (shape[0], shape[1]);
    let mut out = vec![0.0; values.len()];
    if rows > 0 {
        out.par_chunks_mut(BAND * rows)
            .enumerate()
            .for_each(|(b, band)| {
                let c0 = b * BAND;
                let width = band.len() / rows;
                for (r, row) in values.chunks_exact(cols).enumerate() {
                    for (i, &x) in row[c0..c0 + width].iter().enumerate() {
                        band[i * rows + r] = x;
                    }
                }
            });
    }
    (out, [cols, rows])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Quantised codes live once, in the page-aligned slab that is
    /// page-locked, and read back as quantising and dequantising gives.
    #[test]
    fn quantised_codes_live_in_the_page_aligned_slab() {
        for base in [BaseDtype::Int8, BaseDtype::Nf4] {
            let params = [
                ("a.weight".to_string(), vec![96, 40]),
                ("norm.weight".to_string(), vec![40]),
                ("b.weight".to_string(), vec![40, 70]),
            ];
            let mut frozen = FrozenParams::layout(&params, FrozenDtype::Base(base), true);
            let values: Vec<Vec<f32>> = params
                .iter()
                .map(|(_, shape)| {
                    let n: usize = shape.iter().product();
                    (0..n)
                        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                        .collect()
                })
                .collect();
            for (k, v) in values.iter().enumerate() {
                frozen.fill(k, v);
            }
            assert!(frozen.int8.iter().all(|w| w.codes.is_empty()));
            assert!(frozen.nf4.iter().all(|w| w.packed.is_empty()));
            let codes = frozen.codes.as_ref().expect("a codes slab");
            assert_eq!(codes.as_slice().as_ptr() as usize % 4096, 0);
            assert_eq!(frozen.slab_bytes().count(), 2, "bf16 values and codes");
            for k in [0, 2] {
                let shape = &params[k].1;
                let (t, held) = transposed(&values[k], shape);
                let want = match base {
                    BaseDtype::Int8 => quantize_int8(&t, held).unwrap().dequantize(),
                    _ => quantize_nf4(&t, held).unwrap().dequantize(),
                };
                assert_eq!(
                    frozen.to_f32(k),
                    transposed(&want, &held).0,
                    "{base} slot {k}"
                );
            }
        }
    }

    #[test]
    fn transposed_moves_every_value_once() {
        for (rows, cols) in [(3, 5), (70, 130), (1, 200), (129, 1)] {
            let values: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let (out, shape) = transposed(&values, &[rows, cols]);
            assert_eq!(shape, [cols, rows]);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(out[c * rows + r], values[r * cols + c]);
                }
            }
        }
    }
}
