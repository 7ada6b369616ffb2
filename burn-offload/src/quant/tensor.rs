//! Dequantisation on the device as burn tensor ops, on any backend: the
//! reference the CUDA kernel (`cuda/dequant.rs`) is tested against, and the
//! path every other backend takes. The packed bytes travel as an Int
//! tensor of one element per byte (0..=255; int8 codes keep their sign):
//! four or eight times the bytes of the host format on the way, but every
//! backend has Int tensors and bitwise ops on them, and none is promised a
//! u8 one. The arithmetic is in f32, in the host reference's order
//! (multiply, then add; no fused multiply-add), so on a CPU backend the
//! result equals [`Nf4Weight::dequantize`] and [`Int8Weight::dequantize`]
//! bit for bit before the final cast to the requested dtype.

use burn::tensor::backend::Backend;
use burn::tensor::{
    DType, ElementConversion, FloatDType, Int, Tensor, TensorCreationOptions, TensorData,
};

use super::error::QuantError;
use super::int8::Int8Weight;
use super::nf4::{Nf4Weight, NF4, NF4_BLOCK};
use crate::host::optim::quant::{QUANT_BLOCK, SIGNED};

/// An [`Nf4Weight`] uploaded as burn tensors.
#[derive(Clone, Debug)]
pub struct Nf4Tensors<B: Backend> {
    /// [`Nf4Weight::packed`], one Int element a byte (0..=255).
    pub packed: Tensor<B, 1, Int>,
    /// [`Nf4Weight::absmax_codes`], one Int element a code (0..=255).
    pub absmax_codes: Tensor<B, 1, Int>,
    /// [`Nf4Weight::absmax_scales`], f32.
    pub absmax_scales: Tensor<B, 1>,
    /// [`Nf4Weight::offset`].
    pub offset: f32,
    /// `[out, in]`.
    pub shape: [usize; 2],
}

/// An [`Int8Weight`] uploaded as burn tensors.
#[derive(Clone, Debug)]
pub struct Int8Tensors<B: Backend> {
    /// [`Int8Weight::codes`], one Int element a code (-127..=127).
    pub codes: Tensor<B, 1, Int>,
    /// [`Int8Weight::scales`], f32, one a row.
    pub scales: Tensor<B, 1>,
    /// `[out, in]`.
    pub shape: [usize; 2],
}

/// `bytes` four to an i32 word, little-endian (byte `4w + k` in bits
/// `8k..8k + 8` of word `w`, the last word padded with zero bytes): how the
/// CUDA kernel takes packed bytes, a quarter of the elements of one Int per
/// byte and no u8 tensor needed.
pub fn pack_words(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut word = [0u8; 4];
            word[..c.len()].copy_from_slice(c);
            i32::from_le_bytes(word)
        })
        .collect()
}

fn ints<B: Backend>(values: Vec<i32>, device: &B::Device) -> Tensor<B, 1, Int> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

fn floats<B: Backend>(values: Vec<f32>, device: &B::Device) -> Tensor<B, 1> {
    let n = values.len();
    let options = TensorCreationOptions::new(device.clone()).with_dtype(DType::F32);
    Tensor::from_data(TensorData::new(values, [n]), options)
}

fn check_len(
    what: &'static str,
    got: usize,
    want: usize,
    shape: [usize; 2],
) -> Result<(), QuantError> {
    if got == want {
        Ok(())
    } else {
        Err(QuantError::Tensors {
            what,
            got,
            want,
            shape,
        })
    }
}

impl<B: Backend> Nf4Tensors<B> {
    /// Uploads `w` to `device`.
    pub fn upload(w: &Nf4Weight, device: &B::Device) -> Self {
        let widen = |bytes: &[u8]| bytes.iter().map(|&b| b as i32).collect::<Vec<_>>();
        Self {
            packed: ints(widen(&w.packed), device),
            absmax_codes: ints(widen(&w.absmax_codes), device),
            absmax_scales: floats(w.absmax_scales.clone(), device),
            offset: w.offset,
            shape: w.shape,
        }
    }

    /// The dequantised `[out, in]` weight in `dtype`: each value's nibble
    /// (high for the first of a byte's pair) looked up in [`NF4`] with
    /// `select`, times its block's absmax `SIGNED[code] * scale + offset`,
    /// computed in f32 and cast to `dtype` last.
    pub fn dequantize(&self, dtype: FloatDType) -> Result<Tensor<B, 2>, QuantError> {
        let [rows, cols] = self.shape;
        let numel = rows * cols;
        let blocks = numel.div_ceil(NF4_BLOCK);
        check_len(
            "packed",
            self.packed.dims()[0],
            numel.div_ceil(2),
            self.shape,
        )?;
        check_len(
            "absmax_codes",
            self.absmax_codes.dims()[0],
            blocks,
            self.shape,
        )?;
        let scales = blocks.div_ceil(QUANT_BLOCK);
        check_len(
            "absmax_scales",
            self.absmax_scales.dims()[0],
            scales,
            self.shape,
        )?;
        let device = self.packed.device();
        if numel == 0 {
            return Ok(Tensor::<B, 2>::zeros(self.shape, &device).cast(dtype));
        }
        // The codes, in element order: a byte's high nibble, then its low one.
        let packed = self.packed.clone();
        let hi = packed.clone().bitwise_right_shift_scalar(4.elem());
        let lo = packed.bitwise_and_scalar(0x0f.elem());
        let bytes = self.packed.dims()[0];
        let codes = Tensor::<B, 1, Int>::stack::<2>(vec![hi, lo], 1)
            .reshape([2 * bytes])
            .slice(0..numel);
        let table = floats::<B>(NF4.to_vec(), &device);
        let mut values = table.select(0, codes);
        // Each block's absmax, dequantised from its double-quantised code.
        let map = floats::<B>(SIGNED.values.to_vec(), &device);
        let scale_of_block =
            Tensor::<B, 1, Int>::arange(0..blocks as i64, &device).div_scalar(QUANT_BLOCK as i32);
        let absmax = map
            .select(0, self.absmax_codes.clone())
            .mul(self.absmax_scales.clone().select(0, scale_of_block))
            .add_scalar(self.offset);
        // A partial last block is padded to a whole one, then cut back.
        let padded = blocks * NF4_BLOCK;
        if padded > numel {
            let pad = Tensor::<B, 1>::zeros([padded - numel], (&device, DType::F32));
            values = Tensor::cat(vec![values, pad], 0);
        }
        let out = values
            .reshape([blocks, NF4_BLOCK])
            .mul(absmax.reshape([blocks, 1]))
            .reshape([padded])
            .slice(0..numel)
            .reshape(self.shape);
        Ok(out.cast(dtype))
    }
}

impl<B: Backend> Int8Tensors<B> {
    /// Uploads `w` to `device`.
    pub fn upload(w: &Int8Weight, device: &B::Device) -> Self {
        let codes = w.codes.iter().map(|&c| c as i32).collect();
        Self {
            codes: ints(codes, device),
            scales: floats(w.scales.clone(), device),
            shape: w.shape,
        }
    }

    /// The dequantised `[out, in]` weight in `dtype`: each code times its
    /// row's step `scale / 127`, in f32, cast to `dtype` last.
    pub fn dequantize(&self, dtype: FloatDType) -> Result<Tensor<B, 2>, QuantError> {
        let [rows, cols] = self.shape;
        check_len("codes", self.codes.dims()[0], rows * cols, self.shape)?;
        check_len("scales", self.scales.dims()[0], rows, self.shape)?;
        let steps = self.scales.clone().div_scalar(127.0f32).reshape([rows, 1]);
        let out = self
            .codes
            .clone()
            .reshape(self.shape)
            .cast(FloatDType::F32)
            .mul(steps);
        Ok(out.cast(dtype))
    }
}
