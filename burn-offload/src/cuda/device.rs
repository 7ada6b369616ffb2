//! Page-locking host memory, the context's scheduling, and the allocator's
//! pools.

use std::ffi::c_void;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn_cubecl::cubecl::client::ComputeClient;
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::cubecl::Runtime;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::CudaContext;

/// `burn::backend::Cuda` in this workspace (fusion is off).
use super::copier::*;
use super::types::*;

/// Page-locks a host range for the lifetime of the guard, so copies from it
/// run at DMA speed. `None` when `X` is not CUDA or the driver refuses (the
/// copies then still work, pageable and slower).
pub(crate) fn pin<X: Backend>(device: &X::Device, data: &[u8]) -> Option<Pinned> {
    let device = cuda_device::<X>(device)?;
    if data.is_empty() {
        return None;
    }
    with_copier(device, |copier| {
        let ptr = data.as_ptr() as *mut c_void;
        // SAFETY: `data` is a live allocation of this many bytes; the guard
        // unregisters it before the store frees it (see `Pinned`).
        let result = unsafe {
            sys::cuMemHostRegister_v2(
                ptr,
                std::mem::size_of_val(data),
                sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        };
        (result == CUresult::CUDA_SUCCESS).then(|| Pinned {
            ptr,
            context: copier.context.clone(),
        })
    })
}

/// A page-locked host range; unlocked on drop.
pub struct Pinned {
    pub(super) ptr: *mut c_void,
    pub(super) context: Arc<CudaContext>,
}

// SAFETY: the guard only carries the address to unregister.
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: registered in `pin`; failure (memory already gone) is harmless.
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr) };
        }
    }
}

/// Makes the threads that wait for CUDA device `X::Device` sleep until the
/// device is done instead of spinning on a core (the driver's default with
/// fewer contexts than cores). The engine's host work (the AdamW update, the
/// gradient folding) runs on every core while the device computes; spinning
/// waiters (the driving thread at each copy wait, cubecl's fence thread, the
/// worker's reads) took cores from it and from the thread that launches the
/// kernels. Applies to the primary context cubecl uses, also when it is
/// already active. A no-op off CUDA; a driver that refuses is not an error
/// (the waits then spin as before), so only the outcome is returned.
pub(crate) fn blocking_sync<X: Backend>(device: &X::Device) -> bool {
    let Some(device) = cuda_device::<X>(device) else {
        return false;
    };
    with_copier(device, |copier| {
        let dev = copier.context.cu_device();
        let (mut flags, mut active) = (0u32, 0i32);
        // SAFETY: a device handle from a live context; valid out-pointers.
        unsafe {
            if sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active)
                != CUresult::CUDA_SUCCESS
            {
                return false;
            }
            let mask = sys::CUctx_flags::CU_CTX_SCHED_MASK as u32;
            let flags = (flags & !mask) | sys::CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC as u32;
            sys::cuDevicePrimaryCtxSetFlags_v2(dev, flags) == CUresult::CUDA_SUCCESS
        }
    })
}

/// A CUDA driver call that failed where the caller can report it.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The device could not be opened.
    #[error("cannot open CUDA device {index}: {source}")]
    Open {
        /// The device's index.
        index: usize,
        /// What the driver said.
        source: cudarc::driver::DriverError,
    },
    /// A driver query failed.
    #[error("CUDA {call} failed: {source}")]
    Driver {
        /// The call.
        call: &'static str,
        /// What the driver said.
        source: cudarc::driver::DriverError,
    },
}

/// How many CUDA devices the driver sees.
pub fn device_count() -> Result<usize, CudaError> {
    CudaContext::device_count()
        .map(|n| n as usize)
        .map_err(|source| CudaError::Driver {
            call: "cuDeviceGetCount",
            source,
        })
}

/// Free memory on CUDA device `index`, in bytes (before this process
/// allocates anything: the planner's budget).
pub fn free_device_bytes(index: usize) -> Result<u64, CudaError> {
    Ok(memory_info(index)?.0)
}

/// Bytes in use on GPU `index` by the driver's count (`nvidia-smi`'s figure).
pub(crate) fn device_used_bytes(index: usize) -> Result<u64, CudaError> {
    let (free, total) = memory_info(index)?;
    Ok(total.saturating_sub(free))
}

/// `(free, total)` bytes of GPU `index` (`cuMemGetInfo` in its primary context).
fn memory_info(index: usize) -> Result<(u64, u64), CudaError> {
    let context = CudaContext::new(index).map_err(|source| CudaError::Open { index, source })?;
    context
        .bind_to_thread()
        .map_err(|source| CudaError::Driver {
            call: "cuCtxSetCurrent",
            source,
        })?;
    let (free, total) =
        cudarc::driver::result::mem_get_info().map_err(|source| CudaError::Driver {
            call: "cuMemGetInfo",
            source,
        })?;
    Ok((free as u64, total as u64))
}

/// `(bytes in use, bytes reserved)` by cubecl's memory pools on `device`:
/// the calling thread's and its upload pool's.
pub fn pool_bytes(device: &CudaDevice) -> (u64, u64) {
    let client = CudaRuntime::client(device);
    let usage = |client: &ComputeClient<CudaRuntime>| match client.memory_usage() {
        Ok(usage) => (usage.bytes_in_use, usage.bytes_reserved),
        Err(_) => (0, 0),
    };
    let (used, reserved) = usage(&client);
    let upload = with_copier(device, |copier| copier.pool.stream);
    let (up_used, up_reserved) = upload.executes(|| usage(&client));
    (used + up_used, reserved + up_reserved)
}

/// Returns the allocator's free pages to the driver when `X` is the CUDA
/// backend: building the store draws every weight on the device once, and the
/// pools would otherwise keep that high-water mark for the whole run.
pub(crate) fn release_free_memory<X: Backend>(device: &X::Device) {
    if let Some(device) = cuda_device::<X>(device) {
        let client = CudaRuntime::client(device);
        let upload = with_copier(device, |copier| {
            copier.pool.release_all(&client);
            copier.pool.stream
        });
        block_on_sync(device);
        client.memory_cleanup();
        upload.executes(|| client.memory_cleanup());
        block_on_sync(device);
    }
}

/// Hands cubecl's queued kernels to the GPU (its channel batches up to 32
/// tasks; a CPU wait before they are issued would leave the GPU idle).
pub(crate) fn flush(device: &CudaDevice) {
    CudaRuntime::client(device)
        .flush()
        .unwrap_or_else(|e| panic!("CUDA flush failed: {e:?}"));
}

/// Hands queued kernels to the GPU when `X` is the CUDA backend.
pub(crate) fn flush_backend<X: Backend>(device: &X::Device) {
    if let Some(device) = cuda_device::<X>(device) {
        flush(device);
    }
}

/// Waits for the device's queued work when `X` is the CUDA backend.
pub(crate) fn sync_backend<X: Backend>(device: &X::Device) {
    if let Some(device) = cuda_device::<X>(device) {
        flush(device);
        block_on_sync(device);
    }
}

/// What a CUDA process holds outside cubecl's pools: the context, loaded
/// kernels, cuBLAS's and cuDNN's workspaces, and pages freed but not yet
/// returned by the driver's stream-ordered allocator (1.3–2.1 GiB beyond
/// the pools by `nvidia-smi` in a 70B LoRA step on an H200).
const OUTSIDE_POOLS: u64 = 2 << 30;

/// Holds cubecl's memory pools on CUDA to `budget_bytes` for the clients made
/// from now on: call it before the first CUDA tensor.
/// - Pages are at most an eighth of the budget (at least 512 MiB). Pools
///   keep whole pages reserved, so with quarter-of-the-GPU pages a process
///   held to a budget reserved several times what it used.
/// - A buffer larger than that (`largest_buffer`: a model's f32 embedding
///   table, drawn on the device while the store is built; 4.2 GB for a 128k
///   vocabulary at width 8192) gets a page of its own size, returned after.
/// - The pages of all streams stay under the budget less what the process
///   holds outside the pools: a stream that would pass it first gives back
///   its free pages (the pools otherwise keep every page they grew to,
///   and free pages of one size or stream cannot serve another).
pub fn limit_memory_pages(budget_bytes: u64, largest_buffer: u64) {
    let page = (budget_bytes / 8).max(512 << 20);
    burn_cubecl::cubecl::cuda::set_max_page_size(page);
    burn_cubecl::cubecl::cuda::set_largest_buffer(largest_buffer.next_multiple_of(64 << 20));
    burn_cubecl::cubecl::cuda::set_memory_ceiling(
        budget_bytes.saturating_sub(OUTSIDE_POOLS).max(page),
    );
}

/// Pages cubecl's pools allocated past the budget of [`limit_memory_pages`]
/// (a stream had no free page left to give back).
pub fn pages_past_budget(device: &CudaDevice) -> u64 {
    burn_cubecl::cubecl::cuda::pages_past_ceiling(device)
}
