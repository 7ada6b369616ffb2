//! Host→device copies without `Tensor::from_data`.
//!
//! `from_data` moves weights at ~0.6 GB/s on the H100: it copies the data
//! twice on the host, then issues a pageable copy. Here the host slabs are
//! page-locked in place (`cuMemHostRegister`), and a slab range is copied
//! straight into a fresh cubecl buffer with `cuMemcpyHtoDAsync` on a copy
//! stream of our own, then wrapped as a tensor with no further copy. Because
//! the engine binds block i+1 before it submits block i, the copy of block
//! i+1 runs while block i computes.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor, TensorPrimitive};
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::cubecl::server::Handle;
use burn_cubecl::cubecl::Runtime;
use burn_cubecl::tensor::CubeTensor;

use cudarc::driver::sys::{self, CUevent, CUresult};
use cudarc::driver::CudaContext;

/// `burn::backend::Cuda` in this workspace (fusion is off).
use super::copier::*;
use super::device::*;
use super::types::*;
use crate::transfer::{Landed, UploadWait};

thread_local! {
    /// Inside an [`UploadBatch`]: the upload pool has reclaimed what it can.
    static UPLOAD_BATCH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The batch's buffers, allocated ahead, in upload order: `(bytes, buffer, address)`.
    static AHEAD: RefCell<VecDeque<(usize, Handle, u64)>> = const { RefCell::new(VecDeque::new()) };
}

/// The uploads of one bind. The upload pool reclaims dropped buffers once,
/// before the first of them (a fence per tensor would cost a host round trip
/// each and retire nothing more), and allocates all of the bind's buffers
/// ahead, waiting once for their allocation: the copies are then issued back
/// to back. Allocated one by one, each buffer's host round trips left the
/// copy stream idle behind every small tensor (42–46 GB/s over a bind's
/// copies, against 50–53 serialised).
pub struct UploadBatch(bool);

/// Upload bytes outside batches between two reclaims of the upload pool.
const RECLAIM_BYTES: u64 = 256 << 20;

impl UploadBatch {
    /// `sizes`: the bytes of each upload the batch will make, in order (an
    /// upload of another size gets a buffer of its own).
    pub(crate) fn begin<X: Backend>(device: &X::Device, sizes: &[usize]) -> Self {
        let Some(device) = cuda_device::<X>(device) else {
            return Self(false);
        };
        if UPLOAD_BATCH.get() {
            return Self(false);
        }
        let client = CudaRuntime::client(device);
        let ahead = with_copier(device, |copier| {
            copier.pool.reclaim(&client);
            copier.pool.alloc_many(&client, sizes)
        });
        AHEAD.with(|q| *q.borrow_mut() = ahead.into());
        UPLOAD_BATCH.set(true);
        Self(true)
    }
}

impl Drop for UploadBatch {
    fn drop(&mut self) {
        if self.0 {
            UPLOAD_BATCH.set(false);
            // Buffers the batch did not use were never written or read: back
            // to the pool at once.
            AHEAD.with(|q| q.borrow_mut().clear());
        }
    }
}

/// Starts copying `bytes` (elements of `dtype`) into a fresh device buffer
/// on the upload stream. The buffer must not be read before [`wait_uploads`].
pub(super) fn upload_cube(
    bytes: &[u8],
    dtype: DType,
    shape: &[usize],
    device: &CudaDevice,
) -> CubeTensor<CudaRuntime> {
    let client = CudaRuntime::client(device);
    let len = bytes.len();
    let handle = with_copier(device, |copier| {
        let ahead = AHEAD.with(|q| {
            let mut q = q.borrow_mut();
            q.front()
                .is_some_and(|(size, _, _)| *size == len)
                .then(|| q.pop_front())
                .flatten()
        });
        let (handle, ptr) = match ahead {
            Some((_, handle, ptr)) => (handle, ptr),
            None => {
                // Outside a bind's batch (`Offload` page-ins, one per
                // parameter; checkpoints) a reclaim per upload would wait for
                // the fence of the upload before, keeping the host at most
                // one parameter ahead of the device: reclaim once enough
                // bytes were uploaded since the last one.
                if !UPLOAD_BATCH.get() && copier.pool.unreclaimed_bytes >= RECLAIM_BYTES {
                    copier.pool.reclaim(&client);
                }
                let (_, handle, ptr) = copier
                    .pool
                    .alloc_many(&client, &[len])
                    .pop()
                    .expect("one buffer asked for");
                (handle, ptr)
            }
        };
        copier.pool.track(&handle);
        // SAFETY: `ptr` is a live device allocation of `len` bytes (the
        // handle is held by the tensor we return, and by the upload pool,
        // which keeps kernels that read it from overlapping a later copy into
        // the same memory); `bytes` is a host slice of the same size that its
        // owner keeps alive and unchanged until the
        // engine's next `wait_uploads`: parameter slabs and their bf16
        // copies are only written for groups that are not in flight (a
        // group's deferred update runs before its bind), and the pager
        // keeps checkpoint sources until then.
        unsafe {
            if !copier.uploads_pending {
                check(
                    sys::cuEventRecord(copier.up_start, copier.up),
                    "cuEventRecord",
                );
            }
            check(
                sys::cuMemcpyHtoDAsync_v2(ptr, bytes.as_ptr().cast(), len, copier.up),
                "cuMemcpyHtoDAsync",
            );
            // Re-recorded after every copy: the span ends with the last copy,
            // not when the engine gets round to waiting (in the pipeline that
            // is a block later, and the gap is not copy time).
            check(
                sys::cuEventRecord(copier.up_end, copier.up),
                "cuEventRecord",
            );
        }
        copier.uploads_pending = true;
        copier.pending_bytes += len as u64;
        handle
    });
    CubeTensor::new_contiguous(
        client,
        device.clone(),
        Shape::from(shape.to_vec()),
        handle,
        dtype,
    )
}

/// A tensor of backend `X` whose upload from `bytes` (elements of `dtype`)
/// has been started, when `X` is the CUDA backend or `Autodiff` over it;
/// `None` for every other backend (the caller falls back to `from_data`).
pub(crate) fn try_upload<X: Backend, const D: usize>(
    bytes: &[u8],
    dtype: DType,
    shape: &[usize],
    device: &X::Device,
) -> Option<Tensor<X, D>> {
    let device = cuda_device::<X>(device)?;
    cuda_as(Tensor::<CudaBackend, D>::from_primitive(
        TensorPrimitive::Float(upload_cube(bytes, dtype, shape, device)),
    ))
}

/// Lets the GPU run everything submitted so far, then waits until every
/// started upload has landed.
pub(crate) fn wait_uploads<X: Backend>(device: &X::Device) -> UploadWait {
    let Some(device) = cuda_device::<X>(device) else {
        return UploadWait::default();
    };
    flush(device);
    with_copier(device, |copier| {
        if !copier.uploads_pending {
            return UploadWait::default();
        }
        let started = Instant::now();
        let mut ms = 0.0f32;
        // SAFETY: a stream and events we created, in the current context; both
        // events are recorded on `up` and complete once it is synchronised.
        unsafe {
            check(sys::cuStreamSynchronize(copier.up), "cuStreamSynchronize");
            check(
                sys::cuEventElapsedTime_v2(&mut ms, copier.up_start, copier.up_end),
                "cuEventElapsedTime",
            );
        }
        let wait = UploadWait {
            waited: started.elapsed(),
            bytes: copier.pending_bytes,
            copy_time: Duration::from_secs_f64(f64::from(ms) / 1e3),
        };
        copier.uploads_pending = false;
        copier.pending_bytes = 0;
        wait
    })
}

/// Has a driver thread run `landed` once every upload started so far on this
/// thread has landed (`landed` must not call into CUDA); `Err(landed)` when
/// `X` is not the CUDA backend or `Autodiff` over it.
pub(crate) fn after_uploads<X: Backend>(device: &X::Device, landed: Landed) -> Result<(), Landed> {
    let Some(device) = cuda_device::<X>(device) else {
        return Err(landed);
    };
    with_copier(device, |copier| {
        let data = Box::into_raw(Box::new(landed)).cast::<c_void>();
        // SAFETY: `run_landed` takes back the box made here, once: the
        // driver calls a host function exactly once, after the work queued
        // before it on `up`; when it refuses the call, the box is ours again.
        unsafe {
            let result = sys::cuLaunchHostFunc(copier.up, Some(run_landed), data);
            if result != CUresult::CUDA_SUCCESS {
                // Whatever waits for the callback must not wait forever.
                run_landed(data);
                check(result, "cuLaunchHostFunc");
            }
        };
    });
    Ok(())
}

/// The driver's side of [`after_uploads`].
pub(super) unsafe extern "C" fn run_landed(data: *mut c_void) {
    // SAFETY: `data` is the box `after_uploads` leaked, passed here once.
    let landed = unsafe { Box::from_raw(data.cast::<Landed>()) };
    // A panic must not unwind into the driver.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(landed));
}

/// An upload the host did not wait for (see [`try_upload_ordered`]):
/// dropping it, on any thread, waits for the copy to land.
pub struct CopyInFlight {
    landed: CUevent,
    context: Arc<CudaContext>,
}

// SAFETY: a CUDA event may be waited for and destroyed from any thread that
// makes its context current, which `drop` does.
unsafe impl Send for CopyInFlight {}
// SAFETY: shared references to it give no access to the event.
unsafe impl Sync for CopyInFlight {}

impl Drop for CopyInFlight {
    fn drop(&mut self) {
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: an event we created in this context and recorded once.
            unsafe {
                check(sys::cuEventSynchronize(self.landed), "cuEventSynchronize");
                check(sys::cuEventDestroy_v2(self.landed), "cuEventDestroy");
            }
        }
    }
}

/// As [`try_upload`], but the host does not wait for the copy: the calling
/// thread's compute stream waits for it on the device (an event recorded
/// behind the copy), so the kernels submitted after this return run after it
/// and the host keeps submitting. `bytes` must stay alive and unchanged until
/// the returned [`CopyInFlight`] is dropped.
pub(crate) fn try_upload_ordered<X: Backend, const D: usize>(
    bytes: &[u8],
    dtype: DType,
    shape: &[usize],
    device: &X::Device,
) -> Option<(Tensor<X, D>, CopyInFlight)> {
    let device = cuda_device::<X>(device)?;
    let (cube, in_flight) = upload_cube_ordered(bytes, dtype, shape, device);
    let tensor = cuda_as(Tensor::<CudaBackend, D>::from_primitive(
        TensorPrimitive::Float(cube),
    ))?;
    Some((tensor, in_flight))
}

/// [`upload_cube`] with the calling thread's compute stream ordered behind
/// the copy (see [`try_upload_ordered`]), for elements of any `dtype`.
pub(super) fn upload_cube_ordered(
    bytes: &[u8],
    dtype: DType,
    shape: &[usize],
    device: &CudaDevice,
) -> (CubeTensor<CudaRuntime>, CopyInFlight) {
    let cube = upload_cube(bytes, dtype, shape, device);
    // Kernels submitted before the copy reach the stream ahead of the wait,
    // so they do not wait for it.
    flush(device);
    let (_, compute) = buffer_ptr_and_stream(&cube.client, &cube.handle);
    let in_flight = with_copier(device, |copier| {
        let mut landed: CUevent = std::ptr::null_mut();
        // SAFETY: `landed` is a valid out-pointer; the context is current;
        // `up` and `compute` are live streams of this context.
        unsafe {
            check(
                sys::cuEventCreate(
                    &mut landed,
                    sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                ),
                "cuEventCreate",
            );
            check(sys::cuEventRecord(landed, copier.up), "cuEventRecord");
            check(
                sys::cuStreamWaitEvent(compute, landed, 0),
                "cuStreamWaitEvent",
            );
        }
        CopyInFlight {
            landed,
            context: copier.context.clone(),
        }
    });
    (cube, in_flight)
}
