//! How tensors cross between host memory and a backend's device.
//!
//! [`Transfer`] is the copy machinery the [`super::Pager`] drives: uploads
//! straight from page-locked host slabs, reads queued behind the kernels
//! that produce them, and the waits between. [`HostTransfer`] is the
//! portable one (every copy through burn's `from_data`/`into_data`, done when
//! issued); the CUDA build has its own (`crate::cuda::CudaTransfer`), which
//! falls back to the host's on other backends. Each method that takes a
//! tensor gives it back (`Err`) or returns `None` where it has no fast path,
//! and the pager then does the portable thing.

use std::convert::Infallible;
use std::time::Duration;

use burn::tensor::backend::Backend;
use burn::tensor::{bf16, BasicOps, DType, FloatDType, Tensor, TensorKind};

use crate::host::bf16::round_into_par;
use crate::host::processes::ProcessGroup;
use crate::quant::QuantizedRef;
use crate::store::ReadBack;

/// A callback run once the uploads started before it have landed.
pub type Landed = Box<dyn FnOnce() + Send>;

/// What a wait for uploads saw: how long the host waited, and the uploads it
/// waited for (their bytes and the time between the first copy's start and
/// the last one's end on the copy stream).
#[derive(Debug, Clone, Copy, Default)]
pub struct UploadWait {
    /// Host time spent waiting.
    pub waited: Duration,
    /// Bytes of the uploads waited for.
    pub bytes: u64,
    /// Their time on the copy stream.
    pub copy_time: Duration,
}

/// A device→host copy: its bytes and how long it took on the copy stream.
#[derive(Debug, Clone, Copy)]
pub struct Download {
    /// Bytes that crossed the bus.
    pub bytes: u64,
    /// Time the copy took.
    pub time: Duration,
}

/// A device→host copy in flight, finished by any thread.
pub trait QueuedRead: Send {
    /// Bytes that cross the bus.
    fn bytes(&self) -> u64;
    /// Waits for the copy and writes (or, with `accumulate`, adds) the
    /// values into `out` (same length, f32).
    fn finish(self, out: &mut [f32], accumulate: bool);
    /// Waits for the copy and writes its values over `out` as bf16 (rounded
    /// to nearest even from f32; a bf16 tensor's arrive unchanged).
    fn finish_bf16(self, out: &mut [bf16])
    where
        Self: Sized,
    {
        let mut scratch = vec![0.0; out.len()];
        self.finish(&mut scratch, false);
        round_into_par(out, &scratch);
    }
    /// Waits for the copy and hands `f` its values as f32, where they
    /// landed if they are f32 (no second copy), else widened into `scratch`.
    fn finish_with<R>(self, scratch: &mut Vec<f32>, len: usize, f: impl FnOnce(&[f32]) -> R) -> R
    where
        Self: Sized,
    {
        scratch.resize(len, 0.0);
        self.finish(scratch, false);
        f(scratch)
    }
}

/// A device's memory at one moment, for traces.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceMemory {
    /// Bytes of live buffers in the allocator's pools.
    pub in_use: u64,
    /// Bytes the pools hold from the driver.
    pub reserved: u64,
    /// Bytes in use on the whole device by the driver's count (what
    /// `nvidia-smi` shows: the pools, the context, libraries' workspaces).
    pub device_used: u64,
    /// Pages the pools allocated past the process's budget (none left to
    /// give back).
    pub pages_past_budget: u64,
}

/// The copy machinery of one kind of device, chosen once by type (the engine
/// picks it for the build), never probed per call.
pub trait Transfer: ReadBack + 'static {
    /// A page-locked host range; unlocked when dropped.
    type Pin: Send + Sync;
    /// A device→host copy queued behind the kernels that produce it.
    type Read: QueuedRead;
    /// Held while one bind's uploads are issued (their buffers allocated ahead).
    type Batch;
    /// An ordered upload's copy in flight: dropping it waits (from any
    /// thread) until the copy has landed, after which its host bytes may be
    /// written or freed.
    type InFlight: Send + Sync + 'static;

    /// A tensor whose upload from `bytes` (elements of `dtype`, shape
    /// `shape`) has been started; `None` where this backend has no fast path.
    fn upload<X: Backend, const D: usize>(
        bytes: &[u8],
        dtype: DType,
        shape: &[usize],
        device: &X::Device,
    ) -> Option<Tensor<X, D>>;
    /// As [`upload`](Self::upload), with the device's later work on this
    /// thread ordered behind the copy by the device itself: the host goes on
    /// at once, and keeps `bytes` unchanged until the returned copy is dropped.
    fn upload_ordered<X: Backend, const D: usize>(
        bytes: &[u8],
        dtype: DType,
        shape: &[usize],
        device: &X::Device,
    ) -> Option<(Tensor<X, D>, Self::InFlight)>;
    /// Starts a bind's uploads, of `sizes` bytes each, in order.
    fn begin_uploads<X: Backend>(device: &X::Device, sizes: &[usize]) -> Self::Batch;
    /// Lets the device run what was submitted, then waits for every started upload.
    fn wait_uploads<X: Backend>(device: &X::Device) -> UploadWait;
    /// Runs `landed` once every upload started so far has landed (from a
    /// driver thread; it must not call into the device); `Err(landed)` where
    /// copies are done when issued.
    fn after_uploads<X: Backend>(device: &X::Device, landed: Landed) -> Result<(), Landed>;
    /// Lets the device start on the work submitted so far.
    fn flush<X: Backend>(device: &X::Device);
    /// Waits until the device has finished the work submitted so far.
    fn sync<X: Backend>(device: &X::Device);
    /// Copies (or adds) an f32 or bf16 tensor into `out` as f32, waiting for it.
    fn read_into<X: Backend, const D: usize>(
        tensor: Tensor<X, D>,
        out: &mut [f32],
        accumulate: bool,
    ) -> Result<Download, Tensor<X, D>>;
    /// An f32 or bf16 tensor's bytes on the host, in its dtype.
    fn read_bytes<X: Backend, const D: usize>(
        tensor: Tensor<X, D>,
    ) -> Result<(Vec<u8>, Download), Tensor<X, D>>;
    /// Queues the copy of an f32 or bf16 tensor to the host without waiting:
    /// behind the kernels that produce it, or with `beside` on a stream of
    /// its own ordered behind them.
    fn start_read<X: Backend, const D: usize>(
        tensor: Tensor<X, D>,
        beside: bool,
    ) -> Result<Self::Read, Tensor<X, D>>;
    /// Page-locks `data` so copies from it run at DMA speed (`None`: not
    /// possible here; copies still work).
    fn pin<X: Backend>(device: &X::Device, data: &[u8]) -> Option<Self::Pin>;
    /// Has threads that wait for the device sleep instead of spinning;
    /// whether it took.
    fn blocking_sync<X: Backend>(device: &X::Device) -> bool;
    /// Gives the device allocator's unused memory back.
    fn release_free_memory<X: Backend>(device: &X::Device);
    /// The device's memory as its allocator and its driver see it.
    fn device_memory<X: Backend>(device: &X::Device) -> Option<DeviceMemory>;
    /// `w` dequantised into a `[out, in]` tensor of `dtype` on `device` by
    /// this machinery's own kernel, with the copies of `w`'s bytes still in
    /// flight (`w` must stay unchanged until they are dropped); `None` where
    /// it has none (the pager then dequantises with burn tensor ops).
    fn dequantize<X: Backend>(
        w: QuantizedRef<'_>,
        dtype: FloatDType,
        device: &X::Device,
    ) -> Option<(Tensor<X, 2>, Vec<Self::InFlight>)> {
        let _ = (w, dtype, device);
        None
    }
    /// Sums, for each of `slots`, its tensors across devices (`slots[k][d]`
    /// on lane `d`'s device; one shape and dtype per slot) onto lane
    /// `root`'s device, without waiting: a collective reduction (NCCL on
    /// CUDA), queued behind the kernels that produce the parts and ahead of
    /// the work submitted after. `Err(slots)` where this machinery has none.
    #[allow(clippy::type_complexity)]
    fn reduce<X: Backend>(
        slots: Vec<Vec<Tensor<X, 1>>>,
        root: usize,
    ) -> Result<Vec<Tensor<X, 1>>, Vec<Vec<Tensor<X, 1>>>>;
    /// Whether lanes on `devices` can sum their gradients (the collective's
    /// library is there where they need one).
    fn can_reduce<X: Backend>(devices: &[X::Device]) -> bool;
    /// Whether a whole-tensor sum of `X`'s runs faster as each row's sum
    /// first, then theirs, than as burn's `sum` (which adds in burn's
    /// order, the one burn-optim's clipping sees).
    fn sums_rows_first<X: Backend>() -> bool {
        false
    }
    /// Whether a process training on `device` can take part in a group's
    /// collectives (the collective's library is there where it needs one).
    fn can_join<X: Backend>(_device: &X::Device) -> bool {
        true
    }
    /// Sums each of `parts` (this process's, one per slot, each on this
    /// process's device) across the processes of `group`, every process
    /// getting the same sums: a collective (NCCL on CUDA), queued behind the
    /// kernels that made the parts. `Err(parts)` where this machinery has
    /// none; the caller then sums through the group's links.
    #[allow(clippy::type_complexity)]
    fn all_reduce<X: Backend>(
        parts: Vec<Tensor<X, 1>>,
        _group: &ProcessGroup,
    ) -> Result<Vec<Tensor<X, 1>>, Vec<Tensor<X, 1>>> {
        Err(parts)
    }
    /// Every process's `part` (one shape and dtype on all), in rank order,
    /// as one tensor of `world ×` its length on this process's device: a
    /// collective as for [`Transfer::all_reduce`], or `Err(part)`.
    fn all_gather<X: Backend>(
        part: Tensor<X, 1>,
        _group: &ProcessGroup,
    ) -> Result<Tensor<X, 1>, Tensor<X, 1>> {
        Err(part)
    }
}

/// Copies through burn's `from_data`/`into_data`: every backend, no
/// overlap (a copy is done when issued).
// A CUDA build's engine uses CUDA's machinery, which falls back to this
// behaviour itself.
#[cfg_attr(feature = "cuda", allow(dead_code))]
#[derive(Debug, Clone, Copy, Default)]
pub struct HostTransfer;

impl QueuedRead for Infallible {
    fn bytes(&self) -> u64 {
        match *self {}
    }

    fn finish(self, _: &mut [f32], _: bool) {
        match self {}
    }
}

impl ReadBack for HostTransfer {}

impl Transfer for HostTransfer {
    type Pin = Infallible;
    type Read = Infallible;
    type Batch = ();
    type InFlight = Infallible;

    fn upload<X: Backend, const D: usize>(
        _: &[u8],
        _: DType,
        _: &[usize],
        _: &X::Device,
    ) -> Option<Tensor<X, D>> {
        None
    }

    fn upload_ordered<X: Backend, const D: usize>(
        _: &[u8],
        _: DType,
        _: &[usize],
        _: &X::Device,
    ) -> Option<(Tensor<X, D>, Infallible)> {
        None
    }

    fn begin_uploads<X: Backend>(_: &X::Device, _: &[usize]) {}

    fn wait_uploads<X: Backend>(_: &X::Device) -> UploadWait {
        UploadWait::default()
    }

    fn after_uploads<X: Backend>(_: &X::Device, landed: Landed) -> Result<(), Landed> {
        Err(landed)
    }

    fn flush<X: Backend>(_: &X::Device) {}

    fn sync<X: Backend>(_: &X::Device) {}

    fn read_into<X: Backend, const D: usize>(
        tensor: Tensor<X, D>,
        _: &mut [f32],
        _: bool,
    ) -> Result<Download, Tensor<X, D>> {
        Err(tensor)
    }

    fn read_bytes<X: Backend, const D: usize>(
        tensor: Tensor<X, D>,
    ) -> Result<(Vec<u8>, Download), Tensor<X, D>> {
        Err(tensor)
    }

    fn start_read<X: Backend, const D: usize>(
        tensor: Tensor<X, D>,
        _: bool,
    ) -> Result<Infallible, Tensor<X, D>> {
        Err(tensor)
    }

    fn pin<X: Backend>(_: &X::Device, _: &[u8]) -> Option<Infallible> {
        None
    }

    fn blocking_sync<X: Backend>(_: &X::Device) -> bool {
        false
    }

    fn release_free_memory<X: Backend>(_: &X::Device) {}

    fn reduce<X: Backend>(
        slots: Vec<Vec<Tensor<X, 1>>>,
        _: usize,
    ) -> Result<Vec<Tensor<X, 1>>, Vec<Vec<Tensor<X, 1>>>> {
        Err(slots)
    }

    fn can_reduce<X: Backend>(_: &[X::Device]) -> bool {
        true
    }

    fn device_memory<X: Backend>(_: &X::Device) -> Option<DeviceMemory> {
        None
    }
}

/// `tensor` on `device`: as it is when it is there already, else through
/// host memory. burn's `to_device` between two CUDA devices goes through
/// cubecl's own NCCL communicators, which one thread cannot set up for two
/// devices. Small tensors (token ids, a weight) cross this way, and the
/// gradient parts of lanes on devices with no collective between them.
pub fn on_device<B: Backend, const D: usize, K>(
    tensor: Tensor<B, D, K>,
    device: &B::Device,
) -> Tensor<B, D, K>
where
    K: TensorKind<B> + BasicOps<B>,
{
    if tensor.device() == *device {
        return tensor;
    }
    Tensor::from_data(tensor.into_data(), device)
}
