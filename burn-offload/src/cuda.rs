//! Host↔device copies for burn's CUDA backend, without `Tensor::from_data`.
//!
//! `from_data` moves weights at ~0.6 GB/s on the H100: it copies the data
//! twice on the host, then issues a pageable copy. Here the host slabs are
//! page-locked in place (`cuMemHostRegister`), and the pager copies a slab
//! range straight into a fresh cubecl buffer with `cuMemcpyHtoDAsync` on a
//! copy stream of our own, then wraps the buffer as a tensor with no further
//! copy (see docs/cuda-pipeline-notes.md for the cubecl internals).
//!
//! Ordering, without access to cubecl's streams or events:
//! - *Before writing* a fresh buffer, it must not be memory that a queued
//!   kernel still reads. Upload buffers come from a cubecl stream of their own
//!   (no kernel runs on it, so its pool holds nothing but upload buffers), and
//!   a buffer the engine has dropped goes back to that pool only once a fence
//!   recorded behind its last readers has passed, one bind later
//!   ([`UploadPool`]). Until run20 every bind waited for the whole device
//!   instead, and the GPU idled while the host issued the next block.
//! - *Before the kernels that read it are submitted* the engine calls
//!   [`wait_uploads`] (via `Pager::ready`), which first flushes cubecl's
//!   submit queue (so the GPU keeps computing while we wait) and then waits for
//!   the copy stream.
//!
//! Because the engine binds block i+1 before it submits block i, the copy of
//! block i+1 runs while block i computes. Gradients come back through a
//! page-locked staging buffer on a second stream.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{bf16, DType, Int, Shape, Tensor, TensorPrimitive};
use burn_cubecl::cubecl::client::ComputeClient;
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::cubecl::future::DynFut;
use burn_cubecl::cubecl::server::{Handle, ServerError};
use burn_cubecl::cubecl::stream_id::StreamId;
use burn_cubecl::cubecl::Runtime;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;

use crate::backend::gemm::Gemm;
use crate::backend::{lower, OffloadTensor};
use cubecl::{CubeCount, CubeDim};
use cudarc::driver::sys::{self, CUevent, CUresult, CUstream};
use cudarc::driver::CudaContext;

/// `burn::backend::Cuda` in this workspace (fusion is off).
pub type CudaBackend = CubeBackend<CudaRuntime, f32, i32, u8>;

/// Whether `X` is the CUDA backend, `Gemm` over it (same tensors, its own
/// matmul), or `Autodiff` over either.
pub fn is_cuda<X: Backend>() -> bool {
    let x = TypeId::of::<X>();
    x == TypeId::of::<CudaBackend>()
        || x == TypeId::of::<Autodiff<CudaBackend>>()
        || x == TypeId::of::<Gemm<CudaBackend>>()
        || x == TypeId::of::<Autodiff<Gemm<CudaBackend>>>()
}

/// A CUDA tensor as one of backend `X`, when `X` [`is_cuda`].
fn cuda_as<X: Backend, const D: usize>(tensor: Tensor<CudaBackend, D>) -> Option<Tensor<X, D>> {
    let x = TypeId::of::<X>();
    let boxed: Box<dyn Any> = if x == TypeId::of::<CudaBackend>() {
        Box::new(tensor)
    } else if x == TypeId::of::<Autodiff<CudaBackend>>() {
        Box::new(Tensor::<Autodiff<CudaBackend>, D>::from_inner(tensor))
    } else if x == TypeId::of::<Gemm<CudaBackend>>() {
        Box::new(as_gemm(tensor))
    } else if x == TypeId::of::<Autodiff<Gemm<CudaBackend>>>() {
        Box::new(Tensor::<Autodiff<Gemm<CudaBackend>>, D>::from_inner(
            as_gemm(tensor),
        ))
    } else {
        return None;
    };
    boxed.downcast::<Tensor<X, D>>().ok().map(|t| *t)
}

/// The same tensor under `Gemm` (whose primitive is `CudaBackend`'s).
fn as_gemm<const D: usize>(tensor: Tensor<CudaBackend, D>) -> Tensor<Gemm<CudaBackend>, D> {
    let TensorPrimitive::Float(t) = tensor.into_primitive() else {
        unreachable!("float tensors of the CUDA backend are not quantized here")
    };
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// A tensor of backend `X` as a CUDA one, when `X` is the CUDA backend or
/// `Gemm` over it (not `Autodiff`: read-backs take plain tensors).
fn as_cuda<X: Backend, const D: usize>(
    tensor: Tensor<X, D>,
) -> Result<Tensor<CudaBackend, D>, Tensor<X, D>> {
    let x = TypeId::of::<X>();
    if x == TypeId::of::<CudaBackend>() {
        let boxed: Box<dyn Any> = Box::new(tensor);
        return Ok(*boxed.downcast().expect("checked type"));
    }
    if x == TypeId::of::<Gemm<CudaBackend>>() {
        let boxed: Box<dyn Any> = Box::new(tensor);
        let tensor: Tensor<Gemm<CudaBackend>, D> = *boxed.downcast().expect("checked type");
        let TensorPrimitive::Float(t) = tensor.into_primitive() else {
            unreachable!("float tensors of the CUDA backend are not quantized here")
        };
        return Ok(Tensor::from_primitive(TensorPrimitive::Float(t)));
    }
    Err(tensor)
}

fn check(result: CUresult, what: &str) {
    assert!(
        result == CUresult::CUDA_SUCCESS,
        "CUDA {what} failed: {result:?}"
    );
}

/// Per-thread copy machinery: the primary context (the one cubecl uses), one
/// stream for uploads, one for gradient downloads, and a page-locked staging
/// buffer for the downloads. Two events bracket the uploads between waits (the
/// first copy's start, the last copy's end), so the achieved host→device rate
/// is measured on the copy stream itself.
struct Copier {
    context: Arc<CudaContext>,
    up: CUstream,
    down: CUstream,
    uploads_pending: bool,
    /// Bytes of the uploads started since the last wait.
    pending_bytes: u64,
    up_start: CUevent,
    up_end: CUevent,
    /// Page-locked bytes for downloads (f32 or bf16 elements).
    staging: *mut u8,
    staging_len: usize,
    pool: UploadPool,
}

impl Copier {
    fn new(device: &CudaDevice) -> Self {
        let context = CudaContext::new(device.index)
            .unwrap_or_else(|e| panic!("cannot open CUDA device {}: {e}", device.index));
        context
            .bind_to_thread()
            .unwrap_or_else(|e| panic!("cannot bind the CUDA context: {e}"));
        let stream = || {
            let mut s: CUstream = std::ptr::null_mut();
            // SAFETY: `s` is a valid out-pointer; the context is current.
            unsafe {
                check(
                    sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
                    "cuStreamCreate",
                )
            };
            s
        };
        let event = || {
            let mut e: CUevent = std::ptr::null_mut();
            // SAFETY: `e` is a valid out-pointer; the context is current.
            unsafe {
                check(
                    sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32),
                    "cuEventCreate",
                )
            };
            e
        };
        Self {
            context,
            up: stream(),
            down: stream(),
            uploads_pending: false,
            pending_bytes: 0,
            up_start: event(),
            up_end: event(),
            staging: std::ptr::null_mut(),
            staging_len: 0,
            pool: UploadPool::new(),
        }
    }

    fn bind(&self) {
        self.context
            .bind_to_thread()
            .unwrap_or_else(|e| panic!("cannot bind the CUDA context: {e}"));
    }

    /// A page-locked buffer of at least `bytes` bytes (page-aligned, so any
    /// element type may be read from it).
    fn staging(&mut self, bytes: usize) -> *mut u8 {
        if self.staging_len < bytes {
            // SAFETY: frees what cuMemAllocHost returned (or null), then
            // allocates `bytes`; the context is current.
            unsafe {
                if !self.staging.is_null() {
                    check(sys::cuMemFreeHost(self.staging.cast()), "cuMemFreeHost");
                }
                let mut p: *mut c_void = std::ptr::null_mut();
                check(sys::cuMemAllocHost_v2(&mut p, bytes), "cuMemAllocHost");
                self.staging = p.cast();
            }
            self.staging_len = bytes;
        }
        self.staging
    }
}

thread_local! {
    static COPIER: RefCell<Option<Copier>> = const { RefCell::new(None) };
}

fn with_copier<R>(device: &CudaDevice, f: impl FnOnce(&mut Copier) -> R) -> R {
    COPIER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let copier = slot.get_or_insert_with(|| Copier::new(device));
        copier.bind();
        f(copier)
    })
}

/// Makes the primary context (cubecl's) current on this thread.
pub(crate) fn bind_context(device: &CudaDevice) {
    with_copier(device, |_| ());
}

/// The device address where `tensor`'s data starts (its buffer stays alive
/// while `tensor` does).
pub(crate) fn device_ptr(tensor: &CubeTensor<CudaRuntime>) -> u64 {
    buffer_ptr(&tensor.client, &tensor.handle)
}

/// The device address of the buffer `handle` names (with its offset).
fn buffer_ptr(client: &ComputeClient<CudaRuntime>, handle: &Handle) -> u64 {
    buffer_ptr_and_stream(client, handle).0
}

/// As [`device_ptr`], with the CUDA stream the calling thread's cubecl
/// kernels run on, already ordered behind `tensor`'s writers (the field
/// vendor/cubecl-cuda adds): work enqueued there runs after every kernel this
/// thread submitted before, and before every one it submits after.
pub(crate) fn device_ptr_and_stream(tensor: &CubeTensor<CudaRuntime>) -> (u64, CUstream) {
    buffer_ptr_and_stream(&tensor.client, &tensor.handle)
}

fn buffer_ptr_and_stream(client: &ComputeClient<CudaRuntime>, handle: &Handle) -> (u64, CUstream) {
    let resource = client
        .get_resource(handle.clone())
        .unwrap_or_else(|e| panic!("no device pointer for a CUDA buffer: {e:?}"));
    (resource.resource().ptr, resource.resource().stream)
}

pub(crate) fn block_on_sync(device: &CudaDevice) {
    wait_fence(CudaRuntime::client(device).sync());
}

/// Blocks until `fence` (from `client.sync()`, on the stream current then) is reached.
fn wait_fence(fence: ComputeFence) {
    burn::tensor::try_read_sync(fence)
        .expect("blocking reads are supported on this platform")
        .unwrap_or_else(|e| panic!("CUDA stream sync failed: {e:?}"));
}

/// A cubecl stream no thread computes on: cubecl numbers a thread's stream
/// when the thread first uses one, so a thread that only asks for its number
/// leaves that stream to us.
fn spare_stream() -> StreamId {
    std::thread::spawn(StreamId::current)
        .join()
        .expect("a thread that only reads its stream id does not panic")
}

/// A fence on the calling thread's cubecl stream: it resolves once every
/// kernel submitted before it has finished.
type ComputeFence = DynFut<Result<(), ServerError>>;

/// Retired sets of upload buffers left unwaited at a bind: with one, a bind
/// waits for the kernels of the block before last, while the last block's
/// are still queued on the device.
const RETIRED_PENDING: usize = 1;

/// Where upload buffers come from, and when their memory may be written again.
///
/// Our copies run on a stream cubecl knows nothing about, so a fresh buffer
/// must not be memory that a queued kernel still reads. cubecl's pools are
/// per stream and ordered on it, so:
/// - buffers are allocated on a cubecl stream of their own (`stream`; no
///   kernel is ever submitted there), whose pool therefore only ever holds
///   upload buffers: activations the compute stream frees never come back to
///   us while its kernels read them;
/// - the pool keeps its own reference to each buffer it handed out (`live`).
///   Once that and cubecl's are the only ones (the engine dropped the tensor,
///   so every kernel reading it has been submitted), the buffer is retired
///   behind a fence recorded on the compute stream then, and our reference is
///   dropped (letting cubecl reuse the memory) only after a later bind has
///   waited for that fence.
///
/// Until run20 every bind waited for the whole device instead: the GPU ran
/// dry at every block while the host issued the next one.
struct UploadPool {
    stream: StreamId,
    live: Vec<Handle>,
    retired: VecDeque<(ComputeFence, Vec<Handle>)>,
}

impl UploadPool {
    fn new() -> Self {
        Self {
            stream: spare_stream(),
            live: Vec::new(),
            retired: VecDeque::new(),
        }
    }

    /// Retires the buffers the engine has dropped since the last call behind a
    /// fence recorded now (on the calling thread's stream, the one that
    /// computes), and gives back to cubecl those retired earlier but for the
    /// last [`RETIRED_PENDING`] sets, waiting for their fences.
    fn reclaim(&mut self, client: &ComputeClient<CudaRuntime>) {
        // cubecl's pool holds one reference, `live` the other: `can_mut`
        // means no tensor holds the buffer any more.
        let (dropped, live) = std::mem::take(&mut self.live)
            .into_iter()
            .partition::<Vec<_>, _>(Handle::can_mut);
        self.live = live;
        if !dropped.is_empty() {
            self.retired.push_back((client.sync(), dropped));
        }
        while self.retired.len() > RETIRED_PENDING {
            self.release_oldest();
        }
    }

    /// Gives every dropped buffer back to cubecl, waiting for the device.
    fn release_all(&mut self, client: &ComputeClient<CudaRuntime>) {
        self.reclaim(client);
        while !self.retired.is_empty() {
            self.release_oldest();
        }
    }

    fn release_oldest(&mut self) {
        if let Some((fence, handles)) = self.retired.pop_front() {
            wait_fence(fence);
            drop(handles);
        }
    }

    /// Buffers of `sizes` bytes for uploads, with their device addresses,
    /// ready to be written from any stream. Each is tracked (`live`) once
    /// handed to [`UploadPool::track`].
    fn alloc_many(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
        sizes: &[usize],
    ) -> Vec<(usize, Handle, u64)> {
        self.stream.executes(|| {
            let buffers = sizes
                .iter()
                .map(|&len| {
                    let handle = client.empty(len);
                    let ptr = buffer_ptr(client, &handle);
                    (len, handle, ptr)
                })
                .collect();
            // A new page is allocated in the stream's order (cuMemAllocAsync):
            // wait for it before another stream writes there. Nothing else
            // runs on this stream, so the wait is a host round trip.
            wait_fence(client.sync());
            buffers
        })
    }

    /// Keeps a reference to a buffer handed to an upload (see the type's docs).
    fn track(&mut self, handle: &Handle) {
        self.live.push(handle.clone());
    }
}

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
/// copy stream idle behind every small tensor (run21: 42–46 GB/s over a
/// bind's copies, against 50–53 serialised).
pub(crate) struct UploadBatch(bool);

impl UploadBatch {
    /// `sizes`: the bytes of each upload the batch will make, in order (an
    /// upload of another size gets a buffer of its own).
    pub(crate) fn begin<X: Backend>(device: &X::Device, sizes: &[usize]) -> Self {
        let Some(device) = (device as &dyn Any).downcast_ref::<CudaDevice>() else {
            return Self(false);
        };
        if !is_cuda::<X>() || UPLOAD_BATCH.get() {
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
fn upload_cube(
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
                if !UPLOAD_BATCH.get() {
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
    let device = (device as &dyn Any).downcast_ref::<CudaDevice>()?;
    if !is_cuda::<X>() {
        return None;
    }
    cuda_as(Tensor::<CudaBackend, D>::from_primitive(
        TensorPrimitive::Float(upload_cube(bytes, dtype, shape, device)),
    ))
}

/// What a wait for uploads saw: how long the host waited, and the uploads it
/// waited for (their bytes and the time between the first copy's start and
/// the last one's end on the copy stream).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UploadWait {
    pub waited: Duration,
    pub bytes: u64,
    pub copy_time: Duration,
}

/// Lets the GPU run everything submitted so far, then waits until every
/// started upload has landed.
pub(crate) fn wait_uploads<X: Backend>(device: &X::Device) -> UploadWait {
    let Some(device) = (device as &dyn Any).downcast_ref::<CudaDevice>() else {
        return UploadWait::default();
    };
    if !is_cuda::<X>() {
        return UploadWait::default();
    }
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

/// A callback the copy stream runs once the uploads before it have landed.
type Landed = Box<dyn FnOnce() + Send>;

/// Has a driver thread run `landed` once every upload started so far on this
/// thread has landed (`landed` must not call into CUDA); `Err(landed)` when
/// `X` is not the CUDA backend or `Autodiff` over it.
pub(crate) fn after_uploads<X: Backend>(device: &X::Device, landed: Landed) -> Result<(), Landed> {
    let Some(device) = (device as &dyn Any).downcast_ref::<CudaDevice>() else {
        return Err(landed);
    };
    if !is_cuda::<X>() {
        return Err(landed);
    }
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
unsafe extern "C" fn run_landed(data: *mut c_void) {
    // SAFETY: `data` is the box `after_uploads` leaked, passed here once.
    let landed = unsafe { Box::from_raw(data.cast::<Landed>()) };
    // A panic must not unwind into the driver.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(landed));
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
    if let Some(device) = (device as &dyn Any).downcast_ref::<CudaDevice>() {
        if is_cuda::<X>() {
            flush(device);
        }
    }
}

/// Waits for the device's queued work when `X` is the CUDA backend.
pub(crate) fn sync_backend<X: Backend>(device: &X::Device) {
    if let Some(device) = (device as &dyn Any).downcast_ref::<CudaDevice>() {
        if is_cuda::<X>() {
            flush(device);
            block_on_sync(device);
        }
    }
}

/// A device→host copy: its bytes and how long it took on the copy stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Download {
    pub bytes: u64,
    pub time: Duration,
}

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
            crate::pager::widen_into(out, values, accumulate);
        } else {
            let values: &[f32] = bytemuck::cast_slice(bytes);
            crate::pager::write_into(out, values, accumulate);
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
        crate::pager::copy_bytes(&mut out, bytes);
        out
    })
}

/// Downloads an f32 or bf16 tensor of the CUDA backend into the page-locked
/// staging buffer, after the kernels that produce it, and hands its bytes to
/// `consume`.
fn read_with<X: Backend, const D: usize, R>(
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
///   otherwise). Until run21 the engine's host worker issued these copies
///   itself, when it got to them: ordered behind whatever had been submitted
///   by then (the next block's backward too), they landed a block late and the
///   worker ended each step about 85 ms behind the device.
///
/// Any thread may finish it (the engine's host worker does): it binds the
/// context first.
pub(crate) struct PendingRead {
    future: ReadFuture,
    dtype: DType,
    len: usize,
    device: CudaDevice,
}

type ReadFuture = std::pin::Pin<
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
fn download_stream() -> StreamId {
    static STREAM: std::sync::OnceLock<StreamId> = std::sync::OnceLock::new();
    *STREAM.get_or_init(spare_stream)
}

/// Starts the copy of `cube` (contiguous) on the current cubecl stream; the
/// future holds the buffer until the copy is done.
fn issue_read(cube: &CubeTensor<CudaRuntime>, dtype: DType) -> ReadFuture {
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

    /// Waits for the copy and writes (or, with `accumulate`, adds) the values
    /// into `out` (same length, f32).
    pub(crate) fn finish(self, out: &mut [f32], accumulate: bool) {
        assert_eq!(out.len(), self.len, "gradient length");
        bind_context(&self.device);
        let bytes = burn_cubecl::cubecl::future::block_on(self.future)
            .unwrap_or_else(|e| panic!("CUDA device-to-host copy failed: {e:?}"));
        let raw = &bytes[..self.len * self.dtype.size()];
        if self.dtype == DType::BF16 {
            crate::pager::widen_into(out, &aligned::<bf16>(raw), accumulate);
        } else {
            crate::pager::write_into(out, &aligned::<f32>(raw), accumulate);
        }
    }
}

/// `raw` as elements of `T`: in place when aligned (cubecl's page-locked
/// staging is), else copied (its fallback, a plain `Vec<u8>`, may not be).
fn aligned<T: bytemuck::Pod>(raw: &[u8]) -> std::borrow::Cow<'_, [T]> {
    match bytemuck::try_cast_slice(raw) {
        Ok(values) => std::borrow::Cow::Borrowed(values),
        Err(_) => std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(raw)),
    }
}

/// The device's compute client for the life of the process: a pending read's
/// future borrows the client it was queued through (cubecl keeps its own
/// clients alive in a global registry too), one per device.
fn device_client(device: &CudaDevice) -> &'static ComputeClient<CudaRuntime> {
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

/// Page-locks a host range for the lifetime of the guard, so copies from it
/// run at DMA speed. `None` when `X` is not CUDA or the driver refuses (the
/// copies then still work, pageable and slower).
pub(crate) fn pin<X: Backend>(device: &X::Device, data: &[u8]) -> Option<Pinned> {
    let device = (device as &dyn Any).downcast_ref::<CudaDevice>()?;
    if !is_cuda::<X>() || data.is_empty() {
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
    ptr: *mut c_void,
    context: Arc<CudaContext>,
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

impl Drop for Copier {
    fn drop(&mut self) {
        if self.context.bind_to_thread().is_ok() {
            // Waiting is what destroys a fence's event.
            for (fence, _) in self.pool.retired.drain(..) {
                let _ = burn_cubecl::cubecl::future::block_on(fence);
            }
            // SAFETY: resources created by this copier in this context.
            unsafe {
                let _ = sys::cuStreamDestroy_v2(self.up);
                let _ = sys::cuStreamDestroy_v2(self.down);
                let _ = sys::cuEventDestroy_v2(self.up_start);
                let _ = sys::cuEventDestroy_v2(self.up_end);
                if !self.staging.is_null() {
                    let _ = sys::cuMemFreeHost(self.staging.cast());
                }
            }
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
    let Some(device) = (device as &dyn Any).downcast_ref::<CudaDevice>() else {
        return false;
    };
    if !is_cuda::<X>() {
        return false;
    }
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

/// Free memory on CUDA device `index`, in bytes (before this process
/// allocates anything: the planner's budget).
pub fn free_device_bytes(index: usize) -> Result<u64, String> {
    let context =
        CudaContext::new(index).map_err(|e| format!("cannot open CUDA device {index}: {e}"))?;
    context
        .bind_to_thread()
        .map_err(|e| format!("cannot bind the CUDA context: {e}"))?;
    let (free, _total) =
        cudarc::driver::result::mem_get_info().map_err(|e| format!("cuMemGetInfo failed: {e}"))?;
    Ok(free as u64)
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
    let Some(device) = (device as &dyn Any).downcast_ref::<CudaDevice>() else {
        return;
    };
    if is_cuda::<X>() {
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

/// `t`'s primitive as a CUDA tensor, for our own kernels: when `B`'s float
/// tensors are burn-cubecl's CUDA tensors (burn's CUDA backend, `Gemm` over
/// it), or `Offload` over either (paged in if host-resident).
pub(crate) fn float_cube<B: Backend, const D: usize>(
    t: &Tensor<B, D>,
) -> Option<CubeTensor<CudaRuntime>> {
    let primitive = t.clone().into_primitive();
    let TensorPrimitive::Float(p) = primitive else {
        return None;
    };
    let p = &p as &dyn Any;
    let cube = if let Some(c) = p.downcast_ref::<CubeTensor<CudaRuntime>>() {
        c.clone()
    } else if let Some(o) = p.downcast_ref::<OffloadTensor<CudaBackend>>() {
        lower(o.clone())
    } else if let Some(o) = p.downcast_ref::<OffloadTensor<Gemm<CudaBackend>>>() {
        lower(o.clone())
    } else {
        return None;
    };
    cube.qparams.is_none().then_some(cube)
}

pub(crate) fn int_cube<B: Backend, const D: usize>(
    t: &Tensor<B, D, Int>,
) -> Option<CubeTensor<CudaRuntime>> {
    let p = t.clone().into_primitive();
    (&p as &dyn Any)
        .downcast_ref::<CubeTensor<CudaRuntime>>()
        .cloned()
}

/// A CUDA tensor back as one of `B`, one that [`float_cube`] accepts.
pub(crate) fn as_float<B: Backend, const D: usize>(t: CubeTensor<CudaRuntime>) -> Tensor<B, D> {
    let x = TypeId::of::<B::FloatTensorPrimitive>();
    let boxed: Box<dyn Any> = if x == TypeId::of::<OffloadTensor<CudaBackend>>() {
        Box::new(OffloadTensor::<CudaBackend>::Device(t))
    } else if x == TypeId::of::<OffloadTensor<Gemm<CudaBackend>>>() {
        Box::new(OffloadTensor::<Gemm<CudaBackend>>::Device(t))
    } else {
        Box::new(t)
    };
    let p = *boxed
        .downcast::<B::FloatTensorPrimitive>()
        .unwrap_or_else(|_| unreachable!("checked by float_cube"));
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// The float dtypes our kernels read.
pub(crate) fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
}

/// Units per plane on NVIDIA GPUs.
const PLANE: u32 = 32;
/// Rows (planes) per cube of a plane-per-row kernel.
const ROWS_PER_CUBE: u32 = 8;

/// The launch of a kernel that gives each of `rows` rows of `row_len`
/// values a plane (`ROWS_PER_CUBE` planes a cube, the plane's lanes along
/// `CUBE_DIM_X`, the row among the cube's along `UNIT_POS_Y`); `None` when
/// there is nothing to compute.
pub(crate) fn plane_per_row(rows: usize, row_len: usize) -> Option<(CubeCount, CubeDim)> {
    (rows > 0 && row_len > 0).then(|| {
        (
            CubeCount::Static(rows.div_ceil(ROWS_PER_CUBE as usize) as u32, 1, 1),
            CubeDim::new_2d(PLANE, ROWS_PER_CUBE),
        )
    })
}
