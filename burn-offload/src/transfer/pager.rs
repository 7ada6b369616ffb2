//! The `Pager`: moves parameter groups between the host store and the compute
//! device, and keeps the books (bytes each way, what is resident, the peak).
//!
//! Binding a group means building the module the engine runs: a clone of the
//! stateless template (whose parameters are zero-cost placeholders) with every
//! parameter of the group replaced, in visit order, by a device tensor made
//! from the group's slab. Gradients come back the same way, positionally.

use std::collections::HashSet;

use std::marker::PhantomData;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{bf16, DType, FloatDType, Tensor, TensorData};

use super::grads::{start_read, GradsFlat, GradsKeep, GradsOut, GradsStart};
use super::{DeviceGrads, DeviceMemory, PendingGradients, Transfer};
use crate::host::slab::Slab;
use crate::quant::{Int8Tensors, Nf4Tensors, QuantizedRef};
use crate::store::{FrozenValues, Member, ParamGroup};

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
    /// See `upload_timed_bytes`.
    pub upload_copy_ns: u64,
    /// Download bytes timed (CUDA), and the nanoseconds their copies took.
    pub download_timed_bytes: u64,
    /// See `download_timed_bytes`.
    pub download_copy_ns: u64,
}

impl PagerStats {
    /// Adds `other`'s counters (another device's) to these.
    pub fn add(&mut self, other: &PagerStats) {
        self.bytes_to_device += other.bytes_to_device;
        self.bytes_to_host += other.bytes_to_host;
        self.resident_bytes += other.resident_bytes;
        self.peak_resident_bytes += other.peak_resident_bytes;
        self.upload_wait_ns += other.upload_wait_ns;
        self.upload_timed_bytes += other.upload_timed_bytes;
        self.upload_copy_ns += other.upload_copy_ns;
        self.download_timed_bytes += other.download_timed_bytes;
        self.download_copy_ns += other.download_copy_ns;
    }

    /// A device→host copy of `bytes` that took `copy_time` on its stream.
    pub(super) fn timed_download(&mut self, bytes: u64, copy_time: std::time::Duration) {
        self.bytes_to_host += bytes;
        self.download_timed_bytes += bytes;
        self.download_copy_ns += copy_time.as_nanos() as u64;
    }
}

/// A block-input checkpoint, on the device or in host memory (its bytes, in
/// the dtype the device computed it in).
pub enum Stash<B: Backend> {
    /// Kept on the device.
    Device(Tensor<B, 3>),
    /// Its bytes in host memory, with its shape and dtype.
    Host(Vec<u8>, [usize; 3], DType),
}

/// Residency and traffic of parameter groups, over the copy machinery `T`.
pub struct Pager<T: Transfer> {
    resident: Vec<(usize, u64)>,
    stats: PagerStats,
    /// Overlap off: each bind waits for the device to finish the work
    /// submitted before it, then for its own copies.
    serial: bool,
    /// Host sources of uploads still in flight (freed by `ready`).
    in_flight: Vec<Vec<u8>>,
    /// Copies of frozen quantised weights still in flight (their bytes are
    /// the store's; dropped by `ready`).
    copies: Vec<T::InFlight>,
    /// Page-locked host slabs; unlocked when the pager drops.
    pinned: Vec<T::Pin>,
    /// The source of [`Pager::upload_filled`]'s uploads.
    filled: UploadBuffer<T>,
    transfer: PhantomData<T>,
}

/// A host buffer that tensors are filled in and uploaded from (the
/// embedding's output, gathered from the store's table), kept across steps:
/// page-aligned, and page-locked on CUDA (pageable copies ran at 6.7 GB/s on
/// the H100, page-locked ones at 55).
struct UploadBuffer<T: Transfer> {
    /// Declared before `slab`: unlocked before it is freed.
    pinned: Option<T::Pin>,
    slab: Option<Slab>,
}

impl<T: Transfer> std::fmt::Debug for Pager<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pager")
            .field("resident", &self.resident)
            .field("stats", &self.stats)
            .field("serial", &self.serial)
            .finish()
    }
}

impl<T: Transfer> Pager<T> {
    /// A pager whose binds wait for the device to be idle and return only once
    /// their copies have landed (`serial`), or that lets copies run behind
    /// compute until [`Pager::ready`].
    pub fn new(serial: bool) -> Self {
        Self {
            resident: Vec::new(),
            stats: PagerStats::default(),
            serial,
            in_flight: Vec::new(),
            copies: Vec::new(),
            pinned: Vec::new(),
            filled: UploadBuffer {
                pinned: None,
                slab: None,
            },
            transfer: PhantomData,
        }
    }

    /// Keeps a block-input checkpoint until the backward needs it: in host
    /// memory on a GPU backend unless `on_device` (so device memory does not
    /// grow with depth), as it is otherwise. The copy waits for the work
    /// that produced `x`.
    pub fn stash<B: Backend>(&mut self, x: Tensor<B, 3>, on_device: bool) -> Stash<B> {
        if !on_device {
            let (dims, dtype) = (x.dims(), x.dtype());
            match T::read_bytes(x) {
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
                if let Some(x) = T::upload::<B, 3>(&bytes, dtype, &dims, device) {
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
            buffer.pinned = None;
            let slab = Slab::zeros(len);
            buffer.pinned = T::pin::<B>(device, bytemuck::cast_slice(slab.as_slice()));
            buffer.slab = Some(slab);
        }
        let values = &mut buffer
            .slab
            .as_mut()
            .expect("allocated above")
            .as_mut_slice()[..len];
        fill(values)?;
        self.stats.bytes_to_device += (len * std::mem::size_of::<f32>()) as u64;
        if let Some(x) = T::upload::<B, 3>(bytemuck::cast_slice(values), DType::F32, &dims, device)
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
    /// [`Transfer::blocking_sync`]); a no-op off CUDA. Returns whether it took.
    pub fn blocking_sync<B: Backend>(&self, device: &B::Device) -> bool {
        T::blocking_sync::<B>(device)
    }

    /// Page-locks `data` (a parameter slab or its bf16 copy) so uploads from
    /// it run at DMA speed; a no-op off CUDA. Returns whether it is now page-locked.
    pub fn pin<B: Backend>(&mut self, data: &[u8], device: &B::Device) -> bool {
        match T::pin::<B>(device, data) {
            Some(pinned) => {
                self.pinned.push(pinned);
                true
            }
            None => false,
        }
    }

    /// Returns once every upload started by earlier binds has landed; call it
    /// before submitting work that reads a bound module. On the GPU it first
    /// hands queued kernels to the device, so compute goes on while we wait.
    pub fn ready<B: Backend>(&mut self, device: &B::Device) {
        let wait = T::wait_uploads::<B>(device);
        self.stats.upload_wait_ns += wait.waited.as_nanos() as u64;
        self.stats.upload_timed_bytes += wait.bytes;
        self.stats.upload_copy_ns += wait.copy_time.as_nanos() as u64;
        self.in_flight.clear();
        self.copies.clear();
    }

    /// Runs `landed` once every upload started so far has landed: on CUDA
    /// from a driver thread when the copy stream gets there (`landed` must
    /// not call into CUDA), elsewhere now (copies are done when issued).
    pub fn after_uploads<B: Backend>(
        &self,
        device: &B::Device,
        landed: impl FnOnce() + Send + 'static,
    ) {
        if let Err(landed) = T::after_uploads::<B>(device, Box::new(landed)) {
            landed()
        }
    }

    /// Gives the device allocator's unused memory back (a no-op off CUDA).
    pub fn release_free_memory<B: Backend>(&self, device: &B::Device) {
        T::release_free_memory::<B>(device);
    }

    /// Waits until the device has finished the work submitted so far (a
    /// no-op off CUDA, where work is done when submitted).
    pub fn sync<B: Backend>(&self, device: &B::Device) {
        T::sync::<B>(device);
    }

    /// The device's memory on CUDA; `None` elsewhere.
    pub fn device_memory<B: Backend>(&self, device: &B::Device) -> Option<DeviceMemory> {
        T::device_memory::<B>(device)
    }

    /// Lets the device start on the work submitted so far (a no-op off CUDA).
    pub fn flush<B: Backend>(&self, device: &B::Device) {
        T::flush::<B>(device);
    }

    /// The traffic and residency counters.
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
        if self.serial {
            // No copy runs behind compute: in the forward, the next block's
            // copy would otherwise overlap the block still running.
            self.sync::<B>(device);
        }
        let width = if bf16.is_some() { 2 } else { 4 };
        // The bind's buffers are allocated ahead, in one go (see
        // `Transfer::begin_uploads`); quantised weights upload otherwise.
        let sizes: Vec<usize> = group
            .members
            .iter()
            .filter_map(|m| match *m {
                Member::Trained(k) => Some(group.slots[k].len * width),
                Member::Frozen(k) => match group.frozen.values(k) {
                    FrozenValues::F32(v) => Some(std::mem::size_of_val(v)),
                    FrozenValues::Bf16(v) => Some(std::mem::size_of_val(v)),
                    FrozenValues::Quantized(_) => None,
                },
            })
            .collect();
        let batch = T::begin_uploads::<B>(device, &sizes);
        let mut bind = Bind::<B, T> {
            transfer: PhantomData,
            copies: &mut self.copies,
            group,
            bf16,
            next: 0,
            skip,
            device,
            require_grad,
        };
        let module = template.map(&mut bind);
        drop(batch);
        debug_assert_eq!(
            bind.next,
            group.members.len(),
            "template and group disagree"
        );
        let bytes = group.numel() * width + group.frozen.bytes();
        self.page_in(group_index, bytes as u64);
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
        let mut visit = GradsOut::<B, T> {
            transfer: PhantomData,
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
    ) -> PendingGradients<T> {
        let mut visit = GradsStart::<B, T> {
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

    /// The gradients of a bound block's parameters (those of `group`, in
    /// visit order), flat and in their dtype, on the device: for a sum
    /// across devices ([`super::sum_lanes`]) before their copy to the host.
    pub fn flat_gradients<B: AutodiffBackend, M: Module<B>>(
        &self,
        module: &M,
        group: &ParamGroup,
        grads: &B::Gradients,
    ) -> DeviceGrads<B::InnerBackend> {
        let mut visit = GradsFlat {
            group,
            next: 0,
            grads,
            flat: DeviceGrads::new(group),
        };
        module.visit(&mut visit);
        visit.flat
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
        start_read::<T, X, D>(tensor, false, &mut self.stats).finish(out, false);
    }

    /// Queues the copies of gradients summed with [`Pager::keep_gradients`],
    /// as [`Pager::start_gradients`] does for a bound module's (`beside`
    /// likewise).
    pub fn start_kept<B: Backend>(
        &mut self,
        kept: DeviceGrads<B>,
        group: &ParamGroup,
        beside: bool,
    ) -> PendingGradients<T> {
        let slots = group
            .slots
            .iter()
            .zip(kept.sums)
            .map(|(slot, sum)| {
                let range = slot.range();
                (
                    range,
                    sum.map(|sum| start_read::<T, B, 1>(sum, beside, &mut self.stats)),
                )
            })
            .collect();
        PendingGradients { slots }
    }
}

/// Replaces each parameter of a group with its upload.
struct Bind<'a, B: Backend, T: Transfer> {
    transfer: PhantomData<T>,
    copies: &'a mut Vec<T::InFlight>,
    group: &'a ParamGroup,
    bf16: Option<&'a [bf16]>,
    next: usize,
    skip: &'a HashSet<ParamId>,
    device: &'a B::Device,
    require_grad: bool,
}

impl<B: Backend, T: Transfer> ModuleMapper<B> for Bind<'_, B, T> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.skip.contains(&param.id) {
            return param;
        }
        let member = self.group.member(self.next);
        self.next += 1;
        let slot = match member {
            Member::Trained(k) => &self.group.slots[k],
            Member::Frozen(k) => {
                // A frozen parameter never requires a gradient.
                let dtype = if self.bf16.is_some() {
                    FloatDType::BF16
                } else {
                    FloatDType::F32
                };
                let shape = &self.group.frozen.slots[k].shape;
                let tensor = frozen_tensor::<B, T, D>(
                    self.group.frozen.values(k),
                    shape,
                    dtype,
                    self.device,
                    self.copies,
                );
                return Param::initialized(param.id, tensor);
            }
        };
        let range = slot.range();
        let (bytes, dtype): (&[u8], DType) = match self.bf16 {
            Some(values) => (bytemuck::cast_slice(&values[range]), DType::BF16),
            None => (
                bytemuck::cast_slice(&self.group.params.as_slice()[range]),
                DType::F32,
            ),
        };
        if let Some(tensor) = T::upload::<B, D>(bytes, dtype, &slot.shape, self.device) {
            return Param::initialized(param.id, tensor.set_require_grad(self.require_grad));
        }
        let data = TensorData::from_bytes_vec(bytes.to_vec(), slot.shape.clone(), dtype);
        let tensor = Tensor::<B, D>::from_data(data, (self.device, dtype));
        Param::initialized(param.id, tensor.set_require_grad(self.require_grad))
    }
}

/// A frozen parameter's values as a device tensor of `dtype`: uploaded as
/// held and cast on the device, or dequantised there (by the machinery's
/// kernel where it has one) and transposed back to the layer's `[in, out]`.
fn frozen_tensor<B: Backend, T: Transfer, const D: usize>(
    values: FrozenValues<'_>,
    shape: &[usize],
    dtype: FloatDType,
    device: &B::Device,
    copies: &mut Vec<T::InFlight>,
) -> Tensor<B, D> {
    let upload = |bytes: &[u8], held: DType| -> Tensor<B, D> {
        let tensor = T::upload::<B, D>(bytes, held, shape, device).unwrap_or_else(|| {
            let data = TensorData::from_bytes_vec(bytes.to_vec(), shape.to_vec(), held);
            Tensor::from_data(data, (device, held))
        });
        if tensor.dtype() == DType::from(dtype) {
            tensor
        } else {
            tensor.cast(dtype)
        }
    };
    let quantized = match values {
        FrozenValues::F32(v) => return upload(bytemuck::cast_slice(v), DType::F32),
        FrozenValues::Bf16(v) => return upload(bytemuck::cast_slice(v), DType::BF16),
        FrozenValues::Quantized(w) => w,
    };
    let streamed = T::dequantize::<B>(quantized, dtype, device).map(|(matrix, in_flight)| {
        copies.extend(in_flight);
        matrix
    });
    let matrix = streamed.unwrap_or_else(|| {
        // Off CUDA: the weight whole, as burn tensors.
        let dequantized = match quantized {
            QuantizedRef::Int8 { .. } => {
                let w = quantized.int8().expect("an int8 weight");
                Int8Tensors::<B>::upload(&w, device).dequantize(dtype)
            }
            QuantizedRef::Nf4 { .. } => {
                let w = quantized.nf4().expect("an NF4 weight");
                Nf4Tensors::<B>::upload(&w, device).dequantize(dtype)
            }
        };
        dequantized.expect("a weight quantised by the store has consistent parts")
    });
    assert_eq!(D, 2, "only weight matrices are quantised");
    Tensor::from_primitive(matrix.transpose().into_primitive())
}
