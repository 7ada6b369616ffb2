//! Device→host copies: waited for through page-locked staging, or queued
//! behind the kernels that produce them and finished by any thread.

use rayon::prelude::*;
use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{bf16, DType, Tensor};
use burn_cubecl::cubecl::client::ComputeClient;
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::cubecl::stream_id::StreamId;
use burn_cubecl::cubecl::Runtime;
use burn_cubecl::tensor::CubeTensor;

use cudarc::driver::sys::{self};

/// `burn::backend::Cuda` in this workspace (fusion is off).
use super::copier::*;
use super::types::*;
use crate::host::rows::{chunk_pairs, write_into};
use crate::transfer::Download;

/// Copies (or, with `accumulate`, adds) the f32 or bf16 tensor `tensor` into
/// `out` (same length, f32); a bf16 tensor crosses the bus in bf16 and is
/// widened on the host. Gives `tensor` back when it is not a tensor of the
/// CUDA backend in one of those dtypes.
pub(crate) fn try_read_into<X: Backend, const D: usize>(
    tensor: Tensor<X, D>,
    out: &mut [f32],
    accumulate: bool,
) -> Result<Download, Tensor<X, D>> {
    read_with(tensor, |bytes, dtype| {
        if dtype == DType::BF16 {
            let values: &[bf16] = bytemuck::cast_slice(bytes);
            widen_into(out, values, accumulate);
        } else {
            let values: &[f32] = bytemuck::cast_slice(bytes);
            write_into(out, values, accumulate);
        }
    })
    .map(|((), copy)| copy)
}

/// The f32 or bf16 tensor's bytes on the host (a checkpoint kept in its
/// compute dtype), or the tensor back as [`try_read_into`].
pub(crate) fn try_read_bytes<X: Backend, const D: usize>(
    tensor: Tensor<X, D>,
) -> Result<(Vec<u8>, Download), Tensor<X, D>> {
    read_with(tensor, |bytes, _| {
        let mut out = vec![0u8; bytes.len()];
        copy_bytes(&mut out, bytes);
        out
    })
}

/// Downloads an f32 or bf16 tensor of the CUDA backend into the page-locked
/// staging buffer, after the kernels that produce it, and hands its bytes to
/// `consume`.
pub(super) fn read_with<X: Backend, const D: usize, R>(
    tensor: Tensor<X, D>,
    consume: impl FnOnce(&[u8], DType) -> R,
) -> Result<(R, Download), Tensor<X, D>> {
    let dtype = tensor.dtype();
    if !matches!(dtype, DType::F32 | DType::BF16) {
        return Err(tensor);
    }
    let tensor = as_cuda(tensor)?;
    let cube = burn_cubecl::kernel::into_contiguous(tensor.into_primitive().tensor());
    let bytes = cube.meta.shape().num_elements() * dtype.size();
    let device = cube.device.clone();
    // The kernels that produce the tensor must have finished before the copy reads it.
    block_on_sync(&device);
    let ptr = device_ptr(&cube);
    let (out, time) = with_copier(&device, |copier| {
        let down = copier.down;
        let staging = copier.staging(bytes);
        let started = Instant::now();
        // SAFETY: `ptr` addresses `bytes` contiguous bytes on the device (held
        // by `cube`); `staging` is a page-locked buffer of at least `bytes`.
        unsafe {
            check(
                sys::cuMemcpyDtoHAsync_v2(staging.cast(), ptr, bytes, down),
                "cuMemcpyDtoHAsync",
            );
            check(sys::cuStreamSynchronize(down), "cuStreamSynchronize");
        }
        let time = started.elapsed();
        // SAFETY: the copy above filled `bytes` bytes at the page-aligned
        // `staging`, which nothing else touches until we return.
        let filled = unsafe { std::slice::from_raw_parts(staging.cast_const(), bytes) };
        (consume(filled, dtype), time)
    });
    drop(cube);
    Ok((
        out,
        Download {
            bytes: bytes as u64,
            time,
        },
    ))
}

/// A device→host copy of an f32 or bf16 tensor into cubecl's page-locked
/// staging, which the host has not waited for. Unlike [`try_read_into`]
/// nothing waits for the device when it is started, so the engine can hand a
/// block's gradients on and submit the next block's backward at once. Its time
/// on the device is not measured (cubecl records no event the engine can
/// read). It is issued when started, either:
/// - **in** the calling thread's cubecl stream, behind the kernels that
///   produce the tensor: the copy runs between them and the next kernels;
/// - or **beside** it, on a cubecl stream kept for downloads, which cubecl
///   orders behind the kernels submitted so far with an event: the copy runs
///   on the copy engine while the next block computes (3.4 GB of gradients
///   per step at 0.85B fp32, about 0.07 s of the compute stream's time
///   otherwise). Issued by the engine's host worker when it got to them, they
///   would be ordered behind whatever had been submitted by then (the next
///   block's backward too) and land a block late.
///
/// Any thread may finish it (the engine's host worker does): it binds the
/// context first.
pub struct PendingRead {
    pub(super) future: ReadFuture,
    pub(super) dtype: DType,
    pub(super) len: usize,
    pub(super) device: CudaDevice,
}

pub(super) type ReadFuture = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<
                    burn_cubecl::cubecl::bytes::Bytes,
                    burn_cubecl::cubecl::server::ServerError,
                >,
            > + Send,
    >,
>;

/// The cubecl stream downloads beside compute run on (a [`spare_stream`]).
pub(super) fn download_stream() -> StreamId {
    static STREAM: std::sync::OnceLock<StreamId> = std::sync::OnceLock::new();
    *STREAM.get_or_init(spare_stream)
}

/// Starts the copy of `cube` (contiguous) on the current cubecl stream; the
/// future holds the buffer until the copy is done.
pub(super) fn issue_read(cube: &CubeTensor<CudaRuntime>, dtype: DType) -> ReadFuture {
    let descriptor = burn_cubecl::cubecl::server::CopyDescriptor::new(
        cube.handle.clone().binding(),
        cube.meta.shape().clone(),
        cube.meta.strides().clone(),
        dtype.size(),
    );
    Box::pin(device_client(&cube.device).read_one_tensor_async(descriptor))
}

impl PendingRead {
    /// Bytes that cross the bus.
    pub(crate) fn bytes(&self) -> u64 {
        (self.len * self.dtype.size()) as u64
    }

    /// Waits for the copy of `len` values; its dtype and the bytes as they
    /// landed in cubecl's page-locked staging.
    fn landed(self, len: usize) -> (DType, burn_cubecl::cubecl::bytes::Bytes) {
        assert_eq!(len, self.len, "gradient length");
        bind_context(&self.device);
        let bytes = burn_cubecl::cubecl::future::block_on(self.future)
            .unwrap_or_else(|e| panic!("CUDA device-to-host copy failed: {e:?}"));
        (self.dtype, bytes)
    }

    /// Waits for the copy and writes (or, with `accumulate`, adds) the values
    /// into `out` (same length, f32).
    pub(crate) fn finish(self, out: &mut [f32], accumulate: bool) {
        let (dtype, bytes) = self.landed(out.len());
        let raw = &bytes[..out.len() * dtype.size()];
        if dtype == DType::BF16 {
            widen_into(out, &aligned::<bf16>(raw), accumulate);
        } else {
            write_into(out, &aligned::<f32>(raw), accumulate);
        }
    }

    /// Waits for the copy and writes its values over `out` as bf16: a bf16
    /// tensor's bytes straight from the staging buffer, an f32 one's rounded.
    pub(crate) fn finish_bf16(self, out: &mut [bf16]) {
        let (dtype, bytes) = self.landed(out.len());
        let raw = &bytes[..out.len() * dtype.size()];
        if dtype == DType::BF16 {
            copy_bytes(bytemuck::cast_slice_mut(out), raw);
        } else {
            crate::host::bf16::round_into_par(out, &aligned::<f32>(raw));
        }
    }

    /// Waits for the copy and hands `f` the values as f32: in cubecl's
    /// page-locked staging for an f32 tensor, else widened into `scratch`.
    pub(crate) fn finish_with<R>(
        self,
        scratch: &mut Vec<f32>,
        len: usize,
        f: impl FnOnce(&[f32]) -> R,
    ) -> R {
        let (dtype, bytes) = self.landed(len);
        let raw = &bytes[..len * dtype.size()];
        if dtype == DType::BF16 {
            scratch.resize(len, 0.0);
            widen_into(scratch, &aligned::<bf16>(raw), false);
            f(scratch)
        } else {
            f(&aligned::<f32>(raw))
        }
    }
}

/// `raw` as elements of `T`: in place when aligned (cubecl's page-locked
/// staging is), else copied (its fallback, a plain `Vec<u8>`, may not be).
pub(super) fn aligned<T: bytemuck::Pod>(raw: &[u8]) -> std::borrow::Cow<'_, [T]> {
    match bytemuck::try_cast_slice(raw) {
        Ok(values) => std::borrow::Cow::Borrowed(values),
        Err(_) => std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(raw)),
    }
}

/// The device's compute client for the life of the process: a pending read's
/// future borrows the client it was queued through (cubecl keeps its own
/// clients alive in a global registry too), one per device.
pub(super) fn device_client(device: &CudaDevice) -> &'static ComputeClient<CudaRuntime> {
    static CLIENTS: std::sync::Mutex<Vec<(CudaDevice, &'static ComputeClient<CudaRuntime>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut clients = CLIENTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, client)) = clients.iter().find(|(d, _)| d == device) {
        return client;
    }
    let client: &'static ComputeClient<CudaRuntime> =
        Box::leak(Box::new(CudaRuntime::client(device)));
    clients.push((device.clone(), client));
    client
}

/// Starts the copy of an f32 or bf16 tensor of the CUDA backend to the host,
/// in the calling thread's stream or, with `beside`, on the download stream
/// (see [`PendingRead`]); gives the tensor back if it is not one.
pub(crate) fn try_start_read<X: Backend, const D: usize>(
    tensor: Tensor<X, D>,
    beside: bool,
) -> Result<PendingRead, Tensor<X, D>> {
    let dtype = tensor.dtype();
    if !matches!(dtype, DType::F32 | DType::BF16) {
        return Err(tensor);
    }
    let tensor = as_cuda(tensor)?;
    let cube = burn_cubecl::kernel::into_contiguous(tensor.into_primitive().tensor());
    let len = cube.meta.shape().num_elements();
    let device = cube.device.clone();
    let future = if beside {
        download_stream().executes(|| issue_read(&cube, dtype))
    } else {
        issue_read(&cube, dtype)
    };
    Ok(PendingRead {
        future,
        dtype,
        len,
        device,
    })
}

/// `write_into` from bf16 values (a bf16 gradient), widened to f32 as they
/// are written or added.
pub(super) fn widen_into(out: &mut [f32], values: &[bf16], accumulate: bool) {
    let pairs = chunk_pairs(out, values);
    if accumulate {
        pairs.for_each(|(o, v)| o.iter_mut().zip(v).for_each(|(o, v)| *o += v.to_f32()));
    } else {
        pairs.for_each(|(o, v)| o.iter_mut().zip(v).for_each(|(o, v)| *o = v.to_f32()));
    }
}

/// Copies `src` into `dst` (same length) in parallel.
pub(super) fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    const CHUNK: usize = 1 << 20;
    assert_eq!(dst.len(), src.len(), "byte ranges differ in length");
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| d.copy_from_slice(s));
}
