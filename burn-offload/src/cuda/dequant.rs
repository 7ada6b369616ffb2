//! The frozen base's quantised formats ([`crate::quant`]) dequantised on
//! burn's CUDA backend by one CubeCL kernel each, in one pass, straight into
//! the compute dtype (f32, bf16 or f16):
//! - NF4: a unit per packed byte (two values of one block) reads its
//!   block's double-quantised absmax code, dequantises it
//!   (`SIGNED[code] * scale + offset`) and writes `NF4[nibble] * absmax`
//!   for the high nibble, then the low one;
//! - int8: a unit per value writes `code * (scale / 127)` of its row.
//!
//! The packed bytes travel four to an i32 element ([`pack_words`]: byte `k`
//! of a word in its bits `8k..8k + 8`), so the upload is the host format's
//! size and needs no u8 tensor: the kernels take a byte out with an
//! arithmetic shift and a mask (`(word >> 8k) & 0xff`), which is right for
//! negative words too. The code tables (16 NF4 entries, 256 dynamic-map
//! entries) go up as small f32 tensors with each call.
//!
//! On the GPU the compiler may fuse the absmax's multiply and add, so values
//! can differ from the host reference in the last bit of f32.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorCreationOptions, TensorData};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{CubeCount, CubeDim};

use burn_cubecl::cubecl::cuda::CudaDevice;

use super::types::{cuda_as, cuda_device, CudaBackend};
use super::upload::{upload_cube_ordered, CopyInFlight};
use crate::cuda::{as_float, empty_like, float_cube, int_cube, is_float};
use crate::host::optim::quant::SIGNED;
use crate::quant::{pack_words, Int8Weight, Nf4Weight, QuantizedRef, NF4};

/// Units per cube.
const UNITS: u32 = 256;

/// The kernels, apart: cubecl's prelude has a `Tensor` of its own.
mod kernels {
    use cubecl::prelude::*;

    #[cube(launch)]
    pub(super) fn nf4_kernel<F: Float>(
        packed: &Tensor<i32>,
        absmax_codes: &Tensor<i32>,
        absmax_scales: &Tensor<f32>,
        nf4: &Tensor<f32>,
        map: &Tensor<f32>,
        out: &mut Tensor<F>,
        offset: f32,
        numel: u32,
        #[define(F)] _dtype: StorageType,
    ) {
        let byte = ABSOLUTE_POS;
        let first = byte * 2;
        if first >= numel as usize {
            terminate!();
        }
        let value = (packed[byte / 4] >> (((byte % 4) * 8) as i32)) & 0xff;
        // 64 values a block: 32 bytes.
        let block = byte / 32;
        let code = (absmax_codes[block / 4] >> (((block % 4) * 8) as i32)) & 0xff;
        let absmax = map[code as usize] * absmax_scales[block / 256] + offset;
        out[first] = F::cast_from(nf4[(value >> 4) as usize] * absmax);
        if first + 1 < numel as usize {
            out[first + 1] = F::cast_from(nf4[(value & 0x0f) as usize] * absmax);
        }
    }

    #[cube(launch)]
    pub(super) fn int8_kernel<F: Float>(
        codes: &Tensor<i32>,
        scales: &Tensor<f32>,
        out: &mut Tensor<F>,
        numel: u32,
        cols: u32,
        #[define(F)] _dtype: StorageType,
    ) {
        let i = ABSOLUTE_POS;
        if i >= numel as usize {
            terminate!();
        }
        let byte = (codes[i / 4] >> (((i % 4) * 8) as i32)) & 0xff;
        // The byte as a signed code.
        let code = byte - select(byte > 127, 256, 0);
        let step = scales[i / cols as usize] / 127.0;
        out[i] = F::cast_from(f32::cast_from(code) * step);
    }
}
use kernels::{int8_kernel, nf4_kernel};

/// `values` as an i32 tensor on `device`, as cubecl's.
fn ints(mut values: Vec<i32>, device: &CudaDevice) -> Option<CubeTensor<CudaRuntime>> {
    // An empty weight still uploads a word, which the kernel never reads.
    if values.is_empty() {
        values.push(0);
    }
    let n = values.len();
    let t = Tensor::<CudaBackend, 1, Int>::from_data(TensorData::new(values, [n]), device);
    int_cube(&t).filter(|c| c.dtype == DType::I32)
}

/// `values` as an f32 tensor on `device`, as cubecl's.
fn floats(values: Vec<f32>, device: &CudaDevice) -> Option<CubeTensor<CudaRuntime>> {
    let n = values.len();
    let options = TensorCreationOptions::new(device.clone()).with_dtype(DType::F32);
    let t = Tensor::<CudaBackend, 1>::from_data(TensorData::new(values, [n]), options);
    float_cube(&t).filter(|c| c.dtype == DType::F32)
}

/// The output's dtype where the kernels take the job: a float `dtype` and
/// fewer than 2³² values (their indices are `u32`).
fn output_dtype(numel: usize, dtype: FloatDType) -> Option<DType> {
    let dtype = DType::from(dtype);
    (is_float(dtype) && u32::try_from(numel).is_ok()).then_some(dtype)
}

/// `scales` on `device` with one more value after them: an empty weight has
/// no scales, and a tensor of none cannot be made; the kernels never read it.
fn padded_scales(scales: &[f32], device: &CudaDevice) -> Option<CubeTensor<CudaRuntime>> {
    let mut padded = scales.to_vec();
    padded.push(0.0);
    floats(padded, device)
}

/// One unit per `units`, in cubes of [`UNITS`].
fn launch_size(units: usize) -> (CubeCount, CubeDim) {
    let cubes = units.div_ceil(UNITS as usize) as u32;
    (CubeCount::Static(cubes, 1, 1), CubeDim::new_1d(UNITS))
}

/// `bytes` as i32 words on `device`: straight from `bytes` on the upload
/// stream with the compute stream ordered behind the copy (`bytes` must not
/// change until the returned copy is dropped) where `streamed` and the
/// bytes make whole words, else packed and uploaded at once.
fn words(
    bytes: &[u8],
    device: &CudaDevice,
    streamed: bool,
    copies: &mut Vec<CopyInFlight>,
) -> Option<CubeTensor<CudaRuntime>> {
    if streamed && !bytes.is_empty() && bytes.len().is_multiple_of(4) {
        let (cube, copy) = upload_cube_ordered(bytes, DType::I32, &[bytes.len() / 4], device);
        copies.push(copy);
        Some(cube)
    } else {
        ints(pack_words(bytes), device)
    }
}

/// `w` dequantised on `device` into a `[out, in]` tensor of `dtype` by one
/// kernel; `None` off CUDA or for a weight of 2³² values or more.
pub fn dequantize_nf4_cuda<B: Backend>(
    w: &Nf4Weight,
    device: &B::Device,
    dtype: FloatDType,
) -> Option<Tensor<B, 2>> {
    let (tensor, _) = nf4(
        w,
        &w.packed,
        &w.absmax_codes,
        cuda_device::<B>(device)?,
        dtype,
        false,
    )?;
    cuda_as(tensor)
}

/// A frozen base's weight, whose codes lie in the store's page-locked
/// slab, dequantised with its codes copied straight from there on the
/// upload stream; the copies must be kept until they land.
pub(crate) fn streamed<B: Backend>(
    w: QuantizedRef<'_>,
    device: &B::Device,
    dtype: FloatDType,
) -> Option<(Tensor<B, 2>, Vec<CopyInFlight>)> {
    let device = cuda_device::<B>(device)?;
    let (tensor, copies) = match w {
        QuantizedRef::Int8 { weight, codes } => int8(weight, codes, device, dtype, true),
        QuantizedRef::Nf4 {
            weight,
            packed,
            absmax_codes,
        } => nf4(weight, packed, absmax_codes, device, dtype, true),
    }?;
    Some((cuda_as(tensor)?, copies))
}

/// [`dequantize_nf4_cuda`] of `w`'s scales with the codes `packed` and
/// `absmax_codes`, copied straight from there on the upload stream where
/// `streamed` (they must not change until the copies land).
fn nf4(
    w: &Nf4Weight,
    packed: &[u8],
    absmax_codes: &[u8],
    device: &CudaDevice,
    dtype: FloatDType,
    streamed: bool,
) -> Option<(Tensor<CudaBackend, 2>, Vec<CopyInFlight>)> {
    let numel = w.numel();
    let dtype = output_dtype(numel, dtype)?;
    let mut copies = Vec::new();
    let packed_len = packed.len();
    let packed = words(packed, device, streamed, &mut copies)?;
    let codes = words(absmax_codes, device, streamed, &mut copies)?;
    let scales = padded_scales(&w.absmax_scales, device)?;
    let nf4 = floats(NF4.to_vec(), device)?;
    let map = floats(SIGNED.values.to_vec(), device)?;
    let out = empty_like(&packed, &w.shape, dtype);
    if numel > 0 {
        let (count, dim) = launch_size(packed_len);
        nf4_kernel::launch::<CudaRuntime>(
            &packed.client,
            count,
            dim,
            packed.clone().into_tensor_arg(),
            codes.into_tensor_arg(),
            scales.into_tensor_arg(),
            nf4.into_tensor_arg(),
            map.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            w.offset,
            numel as u32,
            dtype.into(),
        );
    }
    Some((as_float(out), copies))
}

/// `w` dequantised on `device` into a `[out, in]` tensor of `dtype` by one
/// kernel; `None` off CUDA or for a weight of 2³² values or more.
pub fn dequantize_int8_cuda<B: Backend>(
    w: &Int8Weight,
    device: &B::Device,
    dtype: FloatDType,
) -> Option<Tensor<B, 2>> {
    let codes = bytemuck::cast_slice(&w.codes);
    let (tensor, _) = int8(w, codes, cuda_device::<B>(device)?, dtype, false)?;
    cuda_as(tensor)
}

/// [`dequantize_int8_cuda`] of `w`'s scales with the codes `codes`,
/// streamed as [`nf4`]'s are.
fn int8(
    w: &Int8Weight,
    codes: &[u8],
    device: &CudaDevice,
    dtype: FloatDType,
    streamed: bool,
) -> Option<(Tensor<CudaBackend, 2>, Vec<CopyInFlight>)> {
    let numel = w.numel();
    let dtype = output_dtype(numel, dtype)?;
    let mut copies = Vec::new();
    let codes = words(codes, device, streamed, &mut copies)?;
    let scales = padded_scales(&w.scales, device)?;
    let out = empty_like(&codes, &w.shape, dtype);
    if numel > 0 {
        let (count, dim) = launch_size(numel);
        int8_kernel::launch::<CudaRuntime>(
            &codes.client,
            count,
            dim,
            codes.clone().into_tensor_arg(),
            scales.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            numel as u32,
            w.shape[1] as u32,
            dtype.into(),
        );
    }
    Some((as_float(out), copies))
}
