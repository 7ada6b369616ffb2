//! The per-thread, per-device copy machinery: the primary context, the upload and
//! download streams, the page-locked staging buffer, and the upload pool
//! that recycles buffers once the kernels that read them are done.
//!
//! Ordering, without access to cubecl's streams or events:
//! - *Before writing* a fresh buffer, it must not be memory that a queued
//!   kernel still reads. Upload buffers come from a cubecl stream of their own
//!   (no kernel runs on it, so its pool holds nothing but upload buffers), and
//!   a buffer the engine has dropped goes back to that pool only once a fence
//!   recorded behind its last readers has passed, one bind later
//!   ([`UploadPool`]), so no bind waits for the whole device.
//! - *Before the kernels that read it are submitted* the engine calls
//!   `wait_uploads` (via `Pager::ready`), which first flushes cubecl's
//!   submit queue (so the GPU keeps computing while we wait) and then waits for
//!   the copy stream.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Arc;

use burn_cubecl::cubecl::client::ComputeClient;
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::cubecl::future::DynFut;
use burn_cubecl::cubecl::server::{Handle, ServerError};
use burn_cubecl::cubecl::stream_id::StreamId;
use burn_cubecl::cubecl::Runtime;
use burn_cubecl::tensor::CubeTensor;

use cudarc::driver::sys::{self, CUevent, CUresult, CUstream};
use cudarc::driver::CudaContext;

pub(super) fn check(result: CUresult, what: &str) {
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
pub(super) struct Copier {
    pub(super) context: Arc<CudaContext>,
    pub(super) up: CUstream,
    pub(super) down: CUstream,
    pub(super) uploads_pending: bool,
    /// Bytes of the uploads started since the last wait.
    pub(super) pending_bytes: u64,
    pub(super) up_start: CUevent,
    pub(super) up_end: CUevent,
    /// Page-locked bytes for downloads (f32 or bf16 elements).
    pub(super) staging: *mut u8,
    pub(super) staging_len: usize,
    pub(super) pool: UploadPool,
}

impl Copier {
    pub(super) fn new(device: &CudaDevice) -> Self {
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

    pub(super) fn bind(&self) {
        self.context
            .bind_to_thread()
            .unwrap_or_else(|e| panic!("cannot bind the CUDA context: {e}"));
    }

    /// A page-locked buffer of at least `bytes` bytes (page-aligned, so any
    /// element type may be read from it).
    pub(super) fn staging(&mut self, bytes: usize) -> *mut u8 {
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
    /// This thread's copier for each device it has used, by device index:
    /// one thread drives every device of a data-parallel engine.
    static COPIERS: RefCell<Vec<Option<Copier>>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn with_copier<R>(device: &CudaDevice, f: impl FnOnce(&mut Copier) -> R) -> R {
    COPIERS.with(|cell| {
        let mut copiers = cell.borrow_mut();
        if copiers.len() <= device.index {
            copiers.resize_with(device.index + 1, || None);
        }
        let copier = copiers[device.index].get_or_insert_with(|| Copier::new(device));
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
pub(super) fn buffer_ptr(client: &ComputeClient<CudaRuntime>, handle: &Handle) -> u64 {
    buffer_ptr_and_stream(client, handle).0
}

/// As [`device_ptr`], with the CUDA stream the calling thread's cubecl
/// kernels run on, already ordered behind `tensor`'s writers (the field
/// vendor/cubecl-cuda adds): work enqueued there runs after every kernel this
/// thread submitted before, and before every one it submits after.
pub(crate) fn device_ptr_and_stream(tensor: &CubeTensor<CudaRuntime>) -> (u64, CUstream) {
    buffer_ptr_and_stream(&tensor.client, &tensor.handle)
}

pub(super) fn buffer_ptr_and_stream(
    client: &ComputeClient<CudaRuntime>,
    handle: &Handle,
) -> (u64, CUstream) {
    let resource = client
        .get_resource(handle.clone())
        .unwrap_or_else(|e| panic!("no device pointer for a CUDA buffer: {e:?}"));
    (resource.resource().ptr, resource.resource().stream)
}

pub(crate) fn block_on_sync(device: &CudaDevice) {
    wait_fence(CudaRuntime::client(device).sync());
}

/// Blocks until `fence` (from `client.sync()`, on the stream current then) is reached.
pub(super) fn wait_fence(fence: ComputeFence) {
    burn::tensor::try_read_sync(fence)
        .expect("blocking reads are supported on this platform")
        .unwrap_or_else(|e| panic!("CUDA stream sync failed: {e:?}"));
}

/// A cubecl stream no thread computes on: cubecl numbers a thread's stream
/// when the thread first uses one, so a thread that only asks for its number
/// leaves that stream to us.
pub(super) fn spare_stream() -> StreamId {
    std::thread::spawn(StreamId::current)
        .join()
        .expect("a thread that only reads its stream id does not panic")
}

/// A fence on the calling thread's cubecl stream: it resolves once every
/// kernel submitted before it has finished.
pub(super) type ComputeFence = DynFut<Result<(), ServerError>>;

/// Retired sets of upload buffers left unwaited at a bind: with one, a bind
/// waits for the kernels of the block before last, while the last block's
/// are still queued on the device.
pub(super) const RETIRED_PENDING: usize = 1;

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
/// Waiting for the whole device at every bind instead left the GPU dry at
/// every block while the host issued the next one.
pub(super) struct UploadPool {
    pub(super) stream: StreamId,
    pub(super) live: Vec<Handle>,
    pub(super) retired: VecDeque<(ComputeFence, Vec<Handle>)>,
    /// Bytes of the buffers tracked since the last reclaim.
    pub(super) unreclaimed_bytes: u64,
}

impl UploadPool {
    pub(super) fn new() -> Self {
        Self {
            stream: spare_stream(),
            live: Vec::new(),
            retired: VecDeque::new(),
            unreclaimed_bytes: 0,
        }
    }

    /// Retires the buffers the engine has dropped since the last call behind a
    /// fence recorded now (on the calling thread's stream, the one that
    /// computes), and gives back to cubecl those retired earlier but for the
    /// last [`RETIRED_PENDING`] sets, waiting for their fences.
    pub(super) fn reclaim(&mut self, client: &ComputeClient<CudaRuntime>) {
        // cubecl's pool holds one reference, `live` the other: `can_mut`
        // means no tensor holds the buffer any more.
        self.unreclaimed_bytes = 0;
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
    pub(super) fn release_all(&mut self, client: &ComputeClient<CudaRuntime>) {
        self.reclaim(client);
        while !self.retired.is_empty() {
            self.release_oldest();
        }
    }

    pub(super) fn release_oldest(&mut self) {
        if let Some((fence, handles)) = self.retired.pop_front() {
            wait_fence(fence);
            drop(handles);
        }
    }

    /// Buffers of `sizes` bytes for uploads, with their device addresses,
    /// ready to be written from any stream. Each is tracked (`live`) once
    /// handed to [`UploadPool::track`].
    pub(super) fn alloc_many(
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
    pub(super) fn track(&mut self, handle: &Handle) {
        self.unreclaimed_bytes += handle.size();
        self.live.push(handle.clone());
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        if self.context.bind_to_thread().is_ok() {
            // Waiting is what destroys a fence's event.
            for (fence, _) in self.pool.retired.drain(..) {
                wait_without_thread_locals(fence);
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

/// Polls `fence` until it resolves, using no thread-local state: a copier is
/// dropped with its thread, and at the main thread's exit an executor's
/// thread-locals (`block_on`'s) may be gone already, which would abort.
fn wait_without_thread_locals(mut fence: ComputeFence) {
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    while fence.as_mut().poll(&mut context).is_pending() {
        std::thread::yield_now();
    }
}
