//! The CUDA copy machinery as the pager's [`Transfer`]; on any other
//! backend each call does what [`crate::transfer::HostTransfer`] does.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, FloatDType, Tensor};

use super::collective::{can_reduce, try_all_gather, try_all_reduce, try_reduce};
use super::dequant;
use super::device::{
    blocking_sync, device_used_bytes, flush_backend, pages_past_budget, pin, pool_bytes,
    release_free_memory, sync_backend, Pinned,
};
use super::download::{try_read_bytes, try_read_into, try_start_read, PendingRead};
use super::types::{cuda_device, is_cuda};
use super::upload::{
    after_uploads, try_upload, try_upload_ordered, wait_uploads, CopyInFlight, UploadBatch,
};
use crate::host::processes::ProcessGroup;
use crate::quant::QuantizedRef;
use crate::store::ReadBack;
use crate::transfer::{
    DeviceMemory, Download, HostTransfer, Landed, QueuedRead, Transfer, UploadWait,
};

/// Copies for burn's CUDA backend (and `Gemm`, `Offload`, `Autodiff` over
/// it) through page-locked memory and streams of their own.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaTransfer;

impl ReadBack for CudaTransfer {
    fn read_back<B: Backend, const D: usize>(tensor: Tensor<B, D>, out: &mut [f32]) {
        if let Err(tensor) = try_read_into(tensor, out, false) {
            HostTransfer::read_back(tensor, out);
        }
    }
}

impl QueuedRead for PendingRead {
    fn bytes(&self) -> u64 {
        PendingRead::bytes(self)
    }

    fn finish(self, out: &mut [f32], accumulate: bool) {
        PendingRead::finish(self, out, accumulate)
    }

    fn finish_bf16(self, out: &mut [burn::tensor::bf16]) {
        PendingRead::finish_bf16(self, out)
    }

    fn finish_with<R>(self, scratch: &mut Vec<f32>, len: usize, f: impl FnOnce(&[f32]) -> R) -> R {
        PendingRead::finish_with(self, scratch, len, f)
    }
}

impl Transfer for CudaTransfer {
    type Pin = Pinned;
    type Read = PendingRead;
    type Batch = UploadBatch;
    type InFlight = CopyInFlight;

    fn upload<X: Backend, const D: usize>(
        bytes: &[u8],
        dtype: DType,
        shape: &[usize],
        device: &X::Device,
    ) -> Option<Tensor<X, D>> {
        try_upload::<X, D>(bytes, dtype, shape, device)
    }

    fn upload_ordered<X: Backend, const D: usize>(
        bytes: &[u8],
        dtype: DType,
        shape: &[usize],
        device: &X::Device,
    ) -> Option<(Tensor<X, D>, CopyInFlight)> {
        try_upload_ordered::<X, D>(bytes, dtype, shape, device)
    }

    fn dequantize<X: Backend>(
        w: QuantizedRef<'_>,
        dtype: FloatDType,
        device: &X::Device,
    ) -> Option<(Tensor<X, 2>, Vec<CopyInFlight>)> {
        dequant::streamed(w, device, dtype)
    }

    fn begin_uploads<X: Backend>(device: &X::Device, sizes: &[usize]) -> UploadBatch {
        UploadBatch::begin::<X>(device, sizes)
    }

    fn wait_uploads<X: Backend>(device: &X::Device) -> UploadWait {
        wait_uploads::<X>(device)
    }

    fn after_uploads<X: Backend>(device: &X::Device, landed: Landed) -> Result<(), Landed> {
        after_uploads::<X>(device, landed)
    }

    fn flush<X: Backend>(device: &X::Device) {
        flush_backend::<X>(device)
    }

    fn sync<X: Backend>(device: &X::Device) {
        sync_backend::<X>(device)
    }

    fn read_into<X: Backend, const D: usize>(
        tensor: Tensor<X, D>,
        out: &mut [f32],
        accumulate: bool,
    ) -> Result<Download, Tensor<X, D>> {
        try_read_into(tensor, out, accumulate)
    }

    fn read_bytes<X: Backend, const D: usize>(
        tensor: Tensor<X, D>,
    ) -> Result<(Vec<u8>, Download), Tensor<X, D>> {
        try_read_bytes(tensor)
    }

    fn start_read<X: Backend, const D: usize>(
        tensor: Tensor<X, D>,
        beside: bool,
    ) -> Result<PendingRead, Tensor<X, D>> {
        try_start_read(tensor, beside)
    }

    fn reduce<X: Backend>(
        slots: Vec<Vec<Tensor<X, 1>>>,
        root: usize,
    ) -> Result<Vec<Tensor<X, 1>>, Vec<Vec<Tensor<X, 1>>>> {
        try_reduce(slots, root)
    }

    fn can_reduce<X: Backend>(devices: &[X::Device]) -> bool {
        can_reduce::<X>(devices)
    }

    fn sums_rows_first<X: Backend>() -> bool {
        // burn's whole-tensor sum on CUDA is one kernel that read the 0.85B
        // Llama's gradients at about 100 GB/s (34 ms of a 4k-token step of
        // the host optimizer's norm clipping); sums along rows run at the
        // device's bandwidth.
        is_cuda::<X>()
    }

    fn can_join<X: Backend>(_device: &X::Device) -> bool {
        !is_cuda::<X>() || super::nccl::is_present()
    }

    fn all_reduce<X: Backend>(
        parts: Vec<Tensor<X, 1>>,
        group: &ProcessGroup,
    ) -> Result<Vec<Tensor<X, 1>>, Vec<Tensor<X, 1>>> {
        try_all_reduce(parts, group)
    }

    fn all_gather<X: Backend>(
        part: Tensor<X, 1>,
        group: &ProcessGroup,
    ) -> Result<Tensor<X, 1>, Tensor<X, 1>> {
        try_all_gather(part, group)
    }

    fn pin<X: Backend>(device: &X::Device, data: &[u8]) -> Option<Pinned> {
        pin::<X>(device, data)
    }

    fn blocking_sync<X: Backend>(device: &X::Device) -> bool {
        blocking_sync::<X>(device)
    }

    fn release_free_memory<X: Backend>(device: &X::Device) {
        release_free_memory::<X>(device)
    }

    fn device_memory<X: Backend>(device: &X::Device) -> Option<DeviceMemory> {
        let device = cuda_device::<X>(device)?;
        let (in_use, reserved) = pool_bytes(device);
        Some(DeviceMemory {
            in_use,
            reserved,
            device_used: device_used_bytes(device.index).unwrap_or(0),
            pages_past_budget: pages_past_budget(device),
        })
    }
}
