//! The `Pager`: moves parameter groups between the host store and the compute
//! device, and keeps the books (bytes each way, what is resident, the peak).
//!
//! Binding a group means building the module the engine runs: a clone of the
//! stateless template (whose parameters are zero-cost placeholders) with every
//! parameter of the group replaced, in visit order, by a device tensor made
//! from the group's slab. Gradients come back the same way, positionally.

use std::collections::HashSet;

use rayon::prelude::*;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{bf16, DType, Tensor, TensorData};

use crate::store::{ParamGroup, Slab};

/// Byte counters of the pager.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagerStats {
    /// Parameter bytes copied host → device.
    pub bytes_to_device: u64,
    /// Gradient bytes copied device → host.
    pub bytes_to_host: u64,
    /// Parameter bytes resident on the device now.
    pub resident_bytes: u64,
    /// Largest `resident_bytes` seen since the last reset.
    pub peak_resident_bytes: u64,
    /// Nanoseconds the engine waited for uploads to land (0 off the GPU).
    pub upload_wait_ns: u64,
    /// Upload bytes timed on the copy stream (CUDA), and the nanoseconds from
    /// the first copy's start to the last one's end, summed over waits: their
    /// ratio is the achieved host→device rate.
    pub upload_timed_bytes: u64,
    pub upload_copy_ns: u64,
    /// Download bytes timed (CUDA), and the nanoseconds their copies took.
    pub download_timed_bytes: u64,
    pub download_copy_ns: u64,
}

impl PagerStats {
    /// A device→host copy of `bytes` that took `copy_time` on its stream.
    #[cfg(feature = "cuda")]
    fn timed_download(&mut self, bytes: u64, copy_time: std::time::Duration) {
        self.bytes_to_host += bytes;
        self.download_timed_bytes += bytes;
        self.download_copy_ns += copy_time.as_nanos() as u64;
    }
}

/// A block-input checkpoint, on the device or in host memory (its bytes, in
/// the dtype the device computed it in).
pub enum Stash<B: Backend> {
    Device(Tensor<B, 3>),
    Host(Vec<u8>, [usize; 3], DType),
}

/// Residency and traffic of parameter groups.
#[derive(Default)]
pub struct Pager {
    resident: Vec<(usize, u64)>,
    stats: PagerStats,
    /// Overlap off: each bind waits for the device to finish the work
    /// submitted before it, then for its own copies.
    serial: bool,
    /// Keep block-input checkpoints in host memory (GPU backends).
    host_checkpoints: bool,
    /// Host sources of uploads still in flight (freed by `ready`).
    in_flight: Vec<Vec<u8>>,
    /// Page-locked host slabs (CUDA); unlocked when the pager drops.
    #[cfg(feature = "cuda")]
    pinned: Vec<crate::cuda::Pinned>,
    /// The source of [`Pager::upload_filled`]'s uploads.
    filled: UploadBuffer,
}

/// A host buffer that tensors are filled in and uploaded from (the
/// embedding's output, gathered from the store's table), kept across steps:
/// page-aligned, and page-locked on CUDA (pageable copies ran at 6.7 GB/s on
/// the H100, page-locked ones at 55).
#[derive(Default)]
struct UploadBuffer {
    /// Declared before `slab`: unlocked before it is freed.
    #[cfg(feature = "cuda")]
    pinned: Option<crate::cuda::Pinned>,
    slab: Option<Slab>,
}

impl std::fmt::Debug for Pager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pager")
            .field("resident", &self.resident)
            .field("stats", &self.stats)
            .field("serial", &self.serial)
            .field("host_checkpoints", &self.host_checkpoints)
            .finish()
    }
}

impl Pager {
    /// A pager whose binds wait for the device to be idle and return only once
    /// their copies have landed (`serial`), or that lets copies run behind
    /// compute until [`Pager::ready`].
    /// With `host_checkpoints`, [`Pager::stash`] moves activations to host
    /// memory where the backend is a GPU.
    pub fn new(serial: bool, host_checkpoints: bool) -> Self {
        Self {
            serial,
            host_checkpoints,
            ..Self::default()
        }
    }

    /// Keeps a block-input checkpoint until the backward needs it: in host
    /// memory on a GPU backend when host checkpoints are on (so device memory
    /// does not grow with depth), as it is otherwise. The copy waits for the
    /// work that produced `x`.
    pub fn stash<B: Backend>(&mut self, x: Tensor<B, 3>) -> Stash<B> {
        #[cfg(feature = "cuda")]
        if self.host_checkpoints {
            let (dims, dtype) = (x.dims(), x.dtype());
            match crate::cuda::try_read_bytes(x) {
                Ok((bytes, copy)) => {
                    self.stats.timed_download(copy.bytes, copy.time);
                    return Stash::Host(bytes, dims, dtype);
                }
                Err(x) => return Stash::Device(x),
            }
        }
        Stash::Device(x)
    }

    /// The checkpoint back on the device. Its upload may still be running:
    /// call [`Pager::ready`] before submitting work that reads it.
    pub fn unstash<B: Backend>(&mut self, stash: Stash<B>, device: &B::Device) -> Tensor<B, 3> {
        match stash {
            Stash::Device(x) => x,
            Stash::Host(bytes, dims, dtype) => {
                self.stats.bytes_to_device += bytes.len() as u64;
                #[cfg(feature = "cuda")]
                if let Some(x) = crate::cuda::try_upload::<B, 3>(&bytes, dtype, &dims, device) {
                    // The copy reads `bytes` until `ready`.
                    self.in_flight.push(bytes);
                    return x;
                }
                let data = TensorData::from_bytes_vec(bytes, dims, dtype);
                Tensor::from_data(data, (device, dtype))
            }
        }
    }

    /// A tensor of shape `dims` whose values `fill` writes (exactly
    /// `dims.product()` f32; its error is returned and nothing is uploaded),
    /// from a host buffer the pager keeps: on CUDA the copy is started, page-
    /// locked, and [`Pager::ready`] must come before work that reads the tensor.
    pub fn upload_filled<B: Backend, E>(
        &mut self,
        dims: [usize; 3],
        device: &B::Device,
        fill: impl FnOnce(&mut [f32]) -> Result<(), E>,
    ) -> Result<Tensor<B, 3>, E> {
        // The last upload from the buffer must have landed before it is
        // written again (a no-op when no copy is running).
        self.ready::<B>(device);
        let len: usize = dims.iter().product();
        let buffer = &mut self.filled;
        if buffer.slab.as_ref().is_none_or(|slab| slab.len() < len) {
            #[cfg(feature = "cuda")]
            {
                buffer.pinned = None;
            }
            let slab = Slab::zeros(len);
            #[cfg(feature = "cuda")]
            {
                buffer.pinned =
                    crate::cuda::pin::<B>(device, bytemuck::cast_slice(slab.as_slice()));
            }
            buffer.slab = Some(slab);
        }
        let values = &mut buffer
            .slab
            .as_mut()
            .expect("allocated above")
            .as_mut_slice()[..len];
        fill(values)?;
        self.stats.bytes_to_device += (len * std::mem::size_of::<f32>()) as u64;
        #[cfg(feature = "cuda")]
        if let Some(x) =
            crate::cuda::try_upload::<B, 3>(bytemuck::cast_slice(values), DType::F32, &dims, device)
        {
            // The copy reads the buffer until `ready`, which the next fill calls.
            return Ok(x);
        }
        Ok(Tensor::from_data(
            TensorData::new(values.to_vec(), dims),
            device,
        ))
    }

    /// Has threads that wait for the device sleep instead of spinning (see
    /// `cuda::blocking_sync`); a no-op off CUDA. Returns whether it took.
    pub fn blocking_sync<B: Backend>(&self, device: &B::Device) -> bool {
        #[cfg(feature = "cuda")]
        return crate::cuda::blocking_sync::<B>(device);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = device;
            false
        }
    }

    /// Page-locks `data` (a parameter slab or its bf16 copy) so uploads from
    /// it run at DMA speed; a no-op off CUDA. Returns whether it is now page-locked.
    pub fn pin<B: Backend>(&mut self, data: &[u8], device: &B::Device) -> bool {
        #[cfg(feature = "cuda")]
        if let Some(pinned) = crate::cuda::pin::<B>(device, data) {
            self.pinned.push(pinned);
            return true;
        }
        let _ = (data, device);
        false
    }

    /// Returns once every upload started by earlier binds has landed; call it
    /// before submitting work that reads a bound module. On the GPU it first
    /// hands queued kernels to the device, so compute goes on while we wait.
    pub fn ready<B: Backend>(&mut self, device: &B::Device) {
        #[cfg(feature = "cuda")]
        {
            let wait = crate::cuda::wait_uploads::<B>(device);
            self.stats.upload_wait_ns += wait.waited.as_nanos() as u64;
            self.stats.upload_timed_bytes += wait.bytes;
            self.stats.upload_copy_ns += wait.copy_time.as_nanos() as u64;
        }
        self.in_flight.clear();
        let _ = device;
    }

    /// Runs `landed` once every upload started so far has landed: on CUDA
    /// from a driver thread when the copy stream gets there (`landed` must
    /// not call into CUDA), elsewhere now (copies are done when issued).
    pub fn after_uploads<B: Backend>(
        &self,
        device: &B::Device,
        landed: impl FnOnce() + Send + 'static,
    ) {
        #[cfg(feature = "cuda")]
        let landed = match crate::cuda::after_uploads::<B>(device, Box::new(landed)) {
            Ok(()) => return,
            Err(landed) => landed,
        };
        let _ = device;
        landed()
    }

    /// Gives the device allocator's unused memory back (a no-op off CUDA).
    pub fn release_free_memory<B: Backend>(&self, device: &B::Device) {
        #[cfg(feature = "cuda")]
        crate::cuda::release_free_memory::<B>(device);
        let _ = device;
    }

    /// Waits until the device has finished the work submitted so far (a
    /// no-op off CUDA, where work is done when submitted).
    pub fn sync<B: Backend>(&self, device: &B::Device) {
        #[cfg(feature = "cuda")]
        crate::cuda::sync_backend::<B>(device);
        let _ = device;
    }

    /// `(bytes in use, bytes reserved)` by the device allocator's pools, on
    /// CUDA; `None` elsewhere.
    pub fn device_memory<B: Backend>(&self, device: &B::Device) -> Option<(u64, u64)> {
        #[cfg(feature = "cuda")]
        if crate::cuda::is_cuda::<B>() {
            let device = (device as &dyn std::any::Any).downcast_ref()?;
            return Some(crate::cuda::pool_bytes(device));
        }
        let _ = device;
        None
    }

    /// Lets the device start on the work submitted so far (a no-op off CUDA).
    pub fn flush<B: Backend>(&self, device: &B::Device) {
        #[cfg(feature = "cuda")]
        crate::cuda::flush_backend::<B>(device);
        let _ = device;
    }

    pub fn stats(&self) -> PagerStats {
        self.stats
    }

    /// Forgets the traffic counters and the peak (residency stays).
    pub fn reset_counters(&mut self) {
        let resident = self.stats.resident_bytes;
        self.stats = PagerStats {
            resident_bytes: resident,
            peak_resident_bytes: resident,
            ..Default::default()
        };
    }

    /// Binds `group` into `template` (on any backend: the inner one for
    /// graph-free forward, `Autodiff<_>` with `require_grad` for recompute),
    /// from its f32 parameters, or from `bf16`, their compute-precision copy
    /// (same layout), when given. `skip` lists parameters that belong to other
    /// groups (the blocks, when binding the stem into the whole model).
    #[allow(clippy::too_many_arguments)]
    pub fn bind<B: Backend, M: Module<B>>(
        &mut self,
        template: M,
        group_index: usize,
        group: &ParamGroup,
        bf16: Option<&[bf16]>,
        skip: &HashSet<ParamId>,
        require_grad: bool,
        device: &B::Device,
    ) -> M {
        let mut bind = Bind {
            group,
            bf16,
            next: 0,
            skip,
            device,
            require_grad,
        };
        if self.serial {
            // No copy runs behind compute: in the forward, the next block's
            // copy would otherwise overlap the block still running.
            self.sync::<B>(device);
        }
        let width = if bf16.is_some() { 2 } else { 4 };
        // The bind's buffers are allocated ahead, in one go (see
        // `cuda::UploadBatch`).
        #[cfg(feature = "cuda")]
        let batch = {
            let sizes: Vec<usize> = group.slots.iter().map(|s| s.len * width).collect();
            crate::cuda::UploadBatch::begin::<B>(device, &sizes)
        };
        let module = template.map(&mut bind);
        #[cfg(feature = "cuda")]
        drop(batch);
        debug_assert_eq!(bind.next, group.slots.len(), "template and group disagree");
        self.page_in(group_index, (group.numel() * width) as u64);
        if self.serial {
            self.ready::<B>(device);
        }
        module
    }

    fn page_in(&mut self, group: usize, bytes: u64) {
        self.stats.bytes_to_device += bytes;
        if !self.resident.iter().any(|(g, _)| *g == group) {
            self.resident.push((group, bytes));
            self.stats.resident_bytes += bytes;
            self.stats.peak_resident_bytes = self
                .stats
                .peak_resident_bytes
                .max(self.stats.resident_bytes);
        }
    }

    /// Records that the engine dropped every module bound from `group`.
    pub fn evict(&mut self, group: usize) {
        if let Some(pos) = self.resident.iter().position(|(g, _)| *g == group) {
            let (_, bytes) = self.resident.swap_remove(pos);
            self.stats.resident_bytes -= bytes;
        }
    }

    /// Copies the gradients of a bound module's parameters (those of `group`,
    /// in visit order) to the host into `out` (`out.len() == group.numel()`):
    /// added to what is there with `accumulate`, else written over it (a
    /// parameter without a gradient then gets zeros). Overwriting spares a
    /// pass that zeroes the buffer first, which cost seconds per step at 7B.
    pub fn gradients_to_host<B: AutodiffBackend, M: Module<B>>(
        &mut self,
        module: &M,
        group: &ParamGroup,
        skip: &HashSet<ParamId>,
        grads: &B::Gradients,
        out: &mut [f32],
        accumulate: bool,
    ) {
        let mut visit = GradsOut {
            group,
            next: 0,
            skip,
            grads,
            out,
            accumulate,
            stats: &mut self.stats,
        };
        module.visit(&mut visit);
    }

    /// Queues the copies of a bound block's gradients (those of `group`, in
    /// visit order) to the host without waiting for the device: on CUDA they
    /// run behind the backward that produces them, and whatever is submitted
    /// next runs behind them. [`PendingGradients::finish`] waits and writes.
    /// Other backends read at once. With `beside` the CUDA copies run on a
    /// stream of their own, ordered behind the backward, while the next
    /// kernels compute (for the engine's host worker, which finishes them).
    pub fn start_gradients<B: AutodiffBackend, M: Module<B>>(
        &mut self,
        module: &M,
        group: &ParamGroup,
        grads: &B::Gradients,
        beside: bool,
    ) -> PendingGradients {
        let mut visit = GradsStart {
            group,
            next: 0,
            grads,
            beside,
            slots: Vec::with_capacity(group.slots.len()),
            stats: &mut self.stats,
        };
        module.visit(&mut visit);
        PendingGradients { slots: visit.slots }
    }

    /// Adds the gradients of a bound module's parameters (those of `group`,
    /// in visit order, without `skip`) to `kept`, on the device.
    pub fn keep_gradients<B: AutodiffBackend, M: Module<B>>(
        &mut self,
        module: &M,
        group: &ParamGroup,
        skip: &HashSet<ParamId>,
        grads: &B::Gradients,
        kept: &mut DeviceGrads<B::InnerBackend>,
    ) {
        module.visit(&mut GradsKeep {
            group,
            next: 0,
            skip,
            grads,
            kept,
        });
    }

    /// Copies `tensor` (f32 or bf16) into `out` as f32, waiting for it: on
    /// CUDA through page-locked staging (bf16 crosses the bus as bf16).
    pub fn read_into<X: Backend, const D: usize>(&mut self, tensor: Tensor<X, D>, out: &mut [f32]) {
        assert_eq!(out.len(), tensor.shape().num_elements(), "host length");
        start_read(tensor, false, &mut self.stats).finish(out, false);
    }

    /// Queues the copies of gradients summed with [`Pager::keep_gradients`],
    /// as [`Pager::start_gradients`] does for a bound module's (`beside`
    /// likewise).
    pub fn start_kept<B: Backend>(
        &mut self,
        kept: DeviceGrads<B>,
        group: &ParamGroup,
        beside: bool,
    ) -> PendingGradients {
        let slots = group
            .slots
            .iter()
            .zip(kept.sums)
            .map(|(slot, sum)| {
                let range = slot.range();
                (
                    range,
                    sum.map(|sum| start_read(sum, beside, &mut self.stats)),
                )
            })
            .collect();
        PendingGradients { slots }
    }
}

struct GradsStart<'a, B: AutodiffBackend> {
    group: &'a ParamGroup,
    next: usize,
    grads: &'a B::Gradients,
    beside: bool,
    slots: Vec<(std::ops::Range<usize>, Option<PendingGrad>)>,
    stats: &'a mut PagerStats,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradsStart<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let slot = &self.group.slots[self.next];
        self.next += 1;
        let range = slot.range();
        let grad = param
            .val()
            .grad(self.grads)
            .map(|grad| start_read(grad, self.beside, self.stats));
        self.slots.push((range, grad));
    }
}

/// Starts the copy of one gradient to the host: queued behind the work that
/// produces it on CUDA, read at once elsewhere.
fn start_read<X: Backend, const D: usize>(
    grad: Tensor<X, D>,
    beside: bool,
    stats: &mut PagerStats,
) -> PendingGrad {
    #[cfg(not(feature = "cuda"))]
    let _ = beside;
    #[cfg(feature = "cuda")]
    let grad = match crate::cuda::try_start_read(grad, beside) {
        Ok(read) => {
            stats.bytes_to_host += read.bytes();
            return PendingGrad::Queued(read);
        }
        Err(grad) => grad,
    };
    stats.bytes_to_host += (grad.shape().num_elements() * grad.dtype().size()) as u64;
    let data = grad.into_data().convert::<f32>();
    PendingGrad::Read(data.into_vec::<f32>().expect("f32 gradient"))
}

/// The gradients of one group summed on the device over several backward
/// passes (the LM head's loss chunks), in f32, one flat tensor per slot in
/// visit order (`None`: no gradient yet). The sum crosses to the host once.
pub struct DeviceGrads<B: Backend> {
    sums: Vec<Option<Tensor<B, 1>>>,
}

impl<B: Backend> DeviceGrads<B> {
    pub fn new(group: &ParamGroup) -> Self {
        Self {
            sums: vec![None; group.slots.len()],
        }
    }
}

struct GradsKeep<'a, B: AutodiffBackend> {
    group: &'a ParamGroup,
    next: usize,
    skip: &'a HashSet<ParamId>,
    grads: &'a B::Gradients,
    kept: &'a mut DeviceGrads<B::InnerBackend>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradsKeep<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.skip.contains(&param.id) {
            return;
        }
        let slot = &self.group.slots[self.next];
        let sum = &mut self.kept.sums[self.next];
        self.next += 1;
        let Some(grad) = param.val().grad(self.grads) else {
            return;
        };
        add_to(sum, grad.reshape([slot.len]).cast(DType::F32));
    }
}

/// Adds `value` to a running sum on the device (`None`: nothing summed yet).
pub(crate) fn add_to<B: Backend, const D: usize>(
    sum: &mut Option<Tensor<B, D>>,
    value: Tensor<B, D>,
) {
    *sum = Some(match sum.take() {
        Some(sum) => sum + value,
        None => value,
    });
}

/// A bound block's gradients on their way to the host ([`Pager::start_gradients`]).
pub struct PendingGradients {
    /// Per slot of the group, in visit order: its range in the group's buffer
    /// and what arrives there (`None`: the parameter got no gradient).
    slots: Vec<(std::ops::Range<usize>, Option<PendingGrad>)>,
}

impl PendingGradients {
    /// Whether slot `k` of the group (visit order) got a gradient.
    pub fn has_gradient(&self, k: usize) -> bool {
        self.slots[k].1.is_some()
    }

    /// Waits for the copies and writes them over `out` (`out.len() ==
    /// group.numel()`; zeros where a parameter got no gradient), or adds
    /// them to it with `accumulate`. Any thread may finish them.
    pub fn finish(self, out: &mut [f32], accumulate: bool) {
        for (range, grad) in self.slots {
            let out = &mut out[range];
            match grad {
                None if accumulate => {}
                None => out.par_chunks_mut(1 << 16).for_each(|c| c.fill(0.0)),
                Some(grad) => grad.finish(out, accumulate),
            }
        }
    }
}

impl PendingGrad {
    /// Waits for the values and writes (or adds) them into `out`.
    fn finish(self, out: &mut [f32], accumulate: bool) {
        match self {
            #[cfg(feature = "cuda")]
            PendingGrad::Queued(read) => read.finish(out, accumulate),
            PendingGrad::Read(values) => write_into(out, &values, accumulate),
        }
    }
}

enum PendingGrad {
    /// A copy queued on the GPU behind the backward.
    #[cfg(feature = "cuda")]
    Queued(crate::cuda::PendingRead),
    /// Read at once (other backends).
    Read(Vec<f32>),
}

/// A template parameter costs nothing: a single zero broadcast to the shape.
pub fn placeholder<B: Backend, const D: usize>(
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::<B, D>::zeros([1; D], device).expand(shape)
}

/// Replaces every float parameter of a module with a placeholder of its shape.
pub struct ToPlaceholders;

impl<B: Backend> ModuleMapper<B> for ToPlaceholders {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let shape: [usize; D] = param.lazy_shape().dims();
        let device = param.lazy_device();
        Param::initialized(param.id, placeholder::<B, D>(shape, &device))
    }
}

struct Bind<'a, B: Backend> {
    group: &'a ParamGroup,
    bf16: Option<&'a [bf16]>,
    next: usize,
    skip: &'a HashSet<ParamId>,
    device: &'a B::Device,
    require_grad: bool,
}

impl<B: Backend> ModuleMapper<B> for Bind<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.skip.contains(&param.id) {
            return param;
        }
        let slot = &self.group.slots[self.next];
        self.next += 1;
        let range = slot.range();
        let (bytes, dtype): (&[u8], DType) = match self.bf16 {
            Some(values) => (bytemuck::cast_slice(&values[range]), DType::BF16),
            None => (
                bytemuck::cast_slice(&self.group.params.as_slice()[range]),
                DType::F32,
            ),
        };
        #[cfg(feature = "cuda")]
        if let Some(tensor) =
            crate::cuda::try_upload::<B, D>(bytes, dtype, &slot.shape, self.device)
        {
            return Param::initialized(param.id, tensor.set_require_grad(self.require_grad));
        }
        let data = TensorData::from_bytes_vec(bytes.to_vec(), slot.shape.clone(), dtype);
        let tensor = Tensor::<B, D>::from_data(data, (self.device, dtype));
        Param::initialized(param.id, tensor.set_require_grad(self.require_grad))
    }
}

struct GradsOut<'a, B: AutodiffBackend> {
    group: &'a ParamGroup,
    next: usize,
    skip: &'a HashSet<ParamId>,
    grads: &'a B::Gradients,
    out: &'a mut [f32],
    accumulate: bool,
    stats: &'a mut PagerStats,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradsOut<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.skip.contains(&param.id) {
            return;
        }
        let slot = &self.group.slots[self.next];
        self.next += 1;
        let out = &mut self.out[slot.range()];
        let Some(grad) = param.val().grad(self.grads) else {
            if !self.accumulate {
                out.fill(0.0);
            }
            return;
        };
        #[cfg(feature = "cuda")]
        let grad = match crate::cuda::try_read_into(grad, out, self.accumulate) {
            Ok(copy) => return self.stats.timed_download(copy.bytes, copy.time),
            Err(grad) => grad,
        };
        self.stats.bytes_to_host += (out.len() * grad.dtype().size()) as u64;
        let data = grad.into_data().convert::<f32>();
        write_into(
            out,
            data.as_slice::<f32>().expect("f32 gradient"),
            self.accumulate,
        );
    }
}

/// Writes `values` over `out`, or adds them with `accumulate`, in parallel:
/// a block's gradients are hundreds of megabytes, and on a GPU the device
/// waits for the next block's work while this runs.
pub(crate) fn write_into(out: &mut [f32], values: &[f32], accumulate: bool) {
    let pairs = chunk_pairs(out, values);
    if accumulate {
        pairs.for_each(|(o, v)| o.iter_mut().zip(v).for_each(|(o, v)| *o += v));
    } else {
        pairs.for_each(|(o, v)| o.copy_from_slice(v));
    }
}

/// Adds row `p` of `values` (`[tokens.len(), width]`) into row `tokens[p]`
/// of `table` (`[rows, width]`) for every position `p`: the gradient of a
/// row lookup. Positions are grouped by token (in order) and each table row
/// goes to one thread whole, so no two threads write a row and the sums come
/// out the same on every run. A token outside `0..rows` is returned as the
/// error, before anything is written.
pub(crate) fn scatter_add_rows(
    table: &mut [f32],
    width: usize,
    tokens: &[i64],
    values: &[f32],
) -> Result<(), i64> {
    assert!(width > 0 && table.len().is_multiple_of(width), "table rows");
    assert_eq!(values.len(), tokens.len() * width, "one row per token");
    let rows = table.len() / width;
    check_tokens(tokens, rows)?;
    // Counting sort: the positions of token r are order[starts[r]..starts[r + 1]].
    let mut starts = vec![0usize; rows + 1];
    for &t in tokens {
        starts[t as usize + 1] += 1;
    }
    for r in 0..rows {
        starts[r + 1] += starts[r];
    }
    let mut next = starts.clone();
    let mut order = vec![0usize; tokens.len()];
    for (p, &t) in tokens.iter().enumerate() {
        order[next[t as usize]] = p;
        next[t as usize] += 1;
    }
    // A row's columns are split too: a frequent token's row (a byte
    // tokenizer's space: a sixth of all positions) would otherwise be one
    // thread's serial sum. Each element still adds its positions in order.
    const COLUMNS: usize = 256;
    table
        .par_chunks_mut(width)
        .enumerate()
        .filter(|(r, _)| starts[r + 1] > starts[*r])
        .for_each(|(r, row)| {
            let positions = &order[starts[r]..starts[r + 1]];
            row.par_chunks_mut(COLUMNS)
                .enumerate()
                .for_each(|(c, cols)| {
                    let first = c * COLUMNS;
                    for &p in positions {
                        let value = &values[p * width + first..p * width + first + cols.len()];
                        cols.iter_mut().zip(value).for_each(|(o, v)| *o += v);
                    }
                });
        });
    Ok(())
}

/// The first token outside `0..rows`, as the error.
pub(crate) fn check_tokens(tokens: &[i64], rows: usize) -> Result<(), i64> {
    match tokens.iter().find(|&&t| t < 0 || t as usize >= rows) {
        Some(&bad) => Err(bad),
        None => Ok(()),
    }
}

/// Copies row `tokens[p]` of `table` (`[rows, width]`) into row `p` of `out`:
/// a lookup in an embedding table. A token outside `0..rows` is returned as
/// the error, before anything is written.
pub(crate) fn gather_rows(
    table: &[f32],
    width: usize,
    tokens: &[i64],
    out: &mut [f32],
) -> Result<(), i64> {
    assert!(width > 0 && table.len().is_multiple_of(width), "table rows");
    assert_eq!(out.len(), tokens.len() * width, "one row per token");
    check_tokens(tokens, table.len() / width)?;
    out.par_chunks_mut(width)
        .zip(tokens.par_iter())
        .for_each(|(row, &t)| {
            let t = t as usize;
            row.copy_from_slice(&table[t * width..(t + 1) * width]);
        });
    Ok(())
}

/// [`write_into`] from bf16 values (a bf16 gradient), widened to f32 as they
/// are written or added.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn widen_into(out: &mut [f32], values: &[bf16], accumulate: bool) {
    let pairs = chunk_pairs(out, values);
    if accumulate {
        pairs.for_each(|(o, v)| o.iter_mut().zip(v).for_each(|(o, v)| *o += v.to_f32()));
    } else {
        pairs.for_each(|(o, v)| o.iter_mut().zip(v).for_each(|(o, v)| *o = v.to_f32()));
    }
}

/// Copies `src` into `dst` (same length) in parallel.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    const CHUNK: usize = 1 << 20;
    assert_eq!(dst.len(), src.len(), "byte ranges differ in length");
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// [`write_into`], returning the sum of squares of what `out` holds after
/// (in f64, as [`crate::optim::sum_of_squares`]) from the same pass.
pub(crate) fn write_into_sum_sq(out: &mut [f32], values: &[f32], accumulate: bool) -> f64 {
    chunk_pairs(out, values)
        .map(|(o, v)| {
            o.iter_mut()
                .zip(v)
                .map(|(o, v)| {
                    *o = if accumulate { *o + v } else { *v };
                    (*o as f64) * (*o as f64)
                })
                .sum::<f64>()
        })
        .sum()
}

fn chunk_pairs<'a, T: Sync>(
    out: &'a mut [f32],
    values: &'a [T],
) -> impl IndexedParallelIterator<Item = (&'a mut [f32], &'a [T])> {
    const CHUNK: usize = 1 << 16;
    assert_eq!(
        out.len(),
        values.len(),
        "host range and values differ in length"
    );
    out.par_chunks_mut(CHUNK).zip(values.par_chunks(CHUNK))
}

#[cfg(test)]
mod tests {
    use super::scatter_add_rows;

    #[test]
    fn scatter_add_rows_sums_the_rows_of_each_token_into_its_row() {
        let width = 3;
        let mut table = vec![1.0f32; 4 * width];
        let tokens = [2i64, 0, 2, 2];
        let values: Vec<f32> = (0..tokens.len() * width).map(|i| i as f32).collect();
        scatter_add_rows(&mut table, width, &tokens, &values).unwrap();
        let mut want = vec![1.0f32; 4 * width];
        for (p, &t) in tokens.iter().enumerate() {
            for c in 0..width {
                want[t as usize * width + c] += values[p * width + c];
            }
        }
        assert_eq!(table, want);
        // Rows 1 and 3 saw no token and keep what they held.
        assert_eq!(&table[width..2 * width], &[1.0; 3]);
    }

    #[test]
    fn scatter_add_rows_rejects_a_token_outside_the_table_and_writes_nothing() {
        let mut table = vec![0.0f32; 2 * 2];
        for bad in [2i64, -1] {
            let err = scatter_add_rows(&mut table, 2, &[0, bad], &[1.0; 4]);
            assert_eq!(err, Err(bad));
            assert_eq!(table, vec![0.0; 4]);
        }
    }
}
