//! Optimizers for `Autodiff<Offload<B>>` that run on the host: each
//! parameter's gradient comes to host memory, the parameter and its moments
//! are updated there with the engine's fused loops (`host::optim`), and the
//! optimizer state never visits the device.
//!
//! The step only queues the work: each gradient's copy to the host starts on
//! a copy stream behind the backward, and one thread runs the updates in the
//! order the optimizer visits the parameters. The next forward starts at
//! once; reading a parameter (paging it in, reading its values) waits for its
//! update, so the host's AdamW over the last parameters overlaps the device's
//! work on the first.
//!
//! They are burn-optim `SimpleOptimizer`s, so burn-optim's
//! `OptimizerAdaptor` walks the module, applies its gradient clipping and
//! keeps the state as a burn `Record` (checkpoints as for any optimizer).
//! The state is two host-resident tensors per parameter and its step count.

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::optim::{LearningRate, SimpleOptimizer};
use burn::record::Record;
use std::cell::RefCell;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Scalar, Shape, Tensor, TensorData, TensorMetadata, TensorPrimitive};

use super::offload::Link;
use super::{read_to_host, HostParams, HostTensor, OffloadTensor, OffloadWith};
use crate::host::norm::{clip_scale, sum_of_squares};
use crate::host::optim::{
    AdamWConfig, GradSlice, MomentSlices, OptimizerConfig, SgdConfig, UpdateSlices,
};
use crate::transfer::{QueuedRead, Transfer};

/// A host optimizer's settings: AdamW or SGD (the engine's
/// [`OptimizerConfig`]) and burn-optim's gradient clipping.
#[derive(Debug, Clone)]
pub struct HostOptimizerConfig {
    /// The update (AdamW by default, burn-optim's defaults).
    pub optimizer: OptimizerConfig,
    /// Clipping applied to each gradient before the update, as burn-optim
    /// applies it.
    pub grad_clipping: Option<GradientClippingConfig>,
}

impl Default for HostOptimizerConfig {
    fn default() -> Self {
        Self {
            optimizer: OptimizerConfig::AdamW(AdamWConfig::default()),
            grad_clipping: None,
        }
    }
}

impl HostOptimizerConfig {
    /// AdamW with `config`'s settings.
    pub fn adamw(config: AdamWConfig) -> Self {
        Self {
            optimizer: OptimizerConfig::AdamW(config),
            grad_clipping: None,
        }
    }

    /// SGD with `config`'s settings.
    pub fn sgd(config: SgdConfig) -> Self {
        Self {
            optimizer: OptimizerConfig::Sgd(config),
            grad_clipping: None,
        }
    }

    /// The same with gradient clipping.
    pub fn with_grad_clipping(mut self, clipping: Option<GradientClippingConfig>) -> Self {
        self.grad_clipping = clipping;
        self
    }

    /// The optimizer for module `M` of `Autodiff<Offload<B>>` (`AB`): burn's
    /// adaptor over [`HostOptimizer`], inside [`HostParams`] (which ends
    /// each step for the page-in trace).
    pub fn init<AB, M>(&self) -> HostParams<OptimizerAdaptor<HostOptimizer, M, AB>>
    where
        AB: AutodiffBackend,
        M: AutodiffModule<AB>,
        HostOptimizer: SimpleOptimizer<AB::InnerBackend>,
    {
        // Norm clipping is the optimizer's own (see `clip_by_norm`); value
        // clipping is burn-optim's, through the adaptor.
        let clip_norm = match self.grad_clipping {
            Some(GradientClippingConfig::Norm(threshold)) => Some(threshold),
            _ => None,
        };
        let mut optim = OptimizerAdaptor::from(HostOptimizer {
            config: self.optimizer,
            clip_norm,
        });
        if let Some(clipping @ GradientClippingConfig::Value(_)) = &self.grad_clipping {
            optim = optim.with_grad_clipping(clipping.init());
        }
        HostParams(optim)
    }
}

/// The per-parameter step of [`HostOptimizerConfig`] (see the module docs).
#[derive(Debug, Clone)]
pub struct HostOptimizer {
    config: OptimizerConfig,
    /// Norm clipping's threshold, applied to each gradient before its update.
    clip_norm: Option<f32>,
}

/// burn-optim's norm clipping of one gradient: scaled by `threshold / (‖g‖ +
/// the dtype's least positive value)` where that is below one. Where `B`
/// sums faster by rows first ([`Transfer::sums_rows_first`]: CUDA), the
/// squared norm is each row's sum, then theirs; elsewhere burn's `sum`, as
/// burn-optim adds.
fn clip_by_norm<B: Backend, T: Transfer, const D: usize>(
    grad: Tensor<OffloadWith<B, T>, D>,
    threshold: f32,
) -> Tensor<OffloadWith<B, T>, D> {
    let squares = grad.clone().square();
    let sum = if T::sums_rows_first::<B>() {
        let numel = squares.shape().num_elements();
        let width = squares.dims()[D - 1].max(1);
        squares.reshape([numel / width, width]).sum_dim(1).sum()
    } else {
        squares.sum()
    };
    let norm = sum.sqrt();
    let min_positive = grad
        .dtype()
        .finfo()
        .unwrap_or(burn::tensor::FloatDType::F32.finfo())
        .min_positive;
    let clip_coef = threshold / norm.add_scalar(min_positive);
    let clip_coef_clamped = clip_coef.clamp_max(1.0);
    grad.mul(clip_coef_clamped.unsqueeze())
}

/// A parameter's optimizer state, in host memory: the two moments (SGD:
/// momentum, and an unused second buffer) and the updates applied so far.
#[derive(Record, Clone)]
pub struct HostOptimizerState<B: Backend, const D: usize> {
    /// First moment (SGD: momentum).
    pub moment_1: Tensor<B, D>,
    /// Second moment (unused by SGD).
    pub moment_2: Tensor<B, D>,
    /// Updates applied (Adam's bias correction; SGD's first step).
    pub time: usize,
}

/// A tensor's values lent to an update on the host: its own host buffer
/// where the tensor is host-resident, f32 and held by no one else (the buffer
/// stays page-locked, nothing is allocated), else a copy. The tensor handed
/// back at once is host-resident, and its readers wait for the update.
struct Lent {
    values: LentValues,
    back: Sender<TensorData>,
}

enum LentValues {
    InPlace(TensorData),
    Copy(Vec<f32>, Shape, DType),
}

impl Lent {
    fn take<B: Backend, T: Transfer, const D: usize>(
        tensor: Tensor<OffloadWith<B, T>, D>,
    ) -> (Self, Tensor<OffloadWith<B, T>, D>) {
        let (shape, dtype, device) = (tensor.shape(), tensor.dtype(), tensor.device());
        let primitive = match tensor.into_primitive() {
            TensorPrimitive::Float(OffloadTensor::Host(host)) if dtype == DType::F32 => {
                if let Some((values, back)) = host.lend() {
                    let lent = Lent {
                        values: LentValues::InPlace(values),
                        back,
                    };
                    let tensor = TensorPrimitive::Float(OffloadTensor::Host(host));
                    return (lent, Tensor::from_primitive(tensor));
                }
                TensorPrimitive::Float(OffloadTensor::Host(host))
            }
            primitive => primitive,
        };
        let tensor = Tensor::<OffloadWith<B, T>, D>::from_primitive(primitive);
        let mut values = vec![0.0; shape.num_elements()];
        read_into::<B, T, D>(tensor, &mut values);
        Self::copy(values, shape, dtype, &device)
    }

    fn zeros<B: Backend, T: Transfer, const D: usize>(
        shape: Shape,
        device: &B::Device,
    ) -> (Self, Tensor<OffloadWith<B, T>, D>) {
        let values = vec![0.0; shape.num_elements()];
        Self::copy(values, shape, DType::F32, device)
    }

    fn copy<B: Backend, T: Transfer, const D: usize>(
        values: Vec<f32>,
        shape: Shape,
        dtype: DType,
        device: &B::Device,
    ) -> (Self, Tensor<OffloadWith<B, T>, D>) {
        let (host, back) = HostTensor::pending(shape.clone(), dtype, device, Link::of::<T>());
        let lent = Lent {
            values: LentValues::Copy(values, shape, dtype),
            back,
        };
        let tensor = TensorPrimitive::Float(OffloadTensor::Host(host));
        (lent, Tensor::from_primitive(tensor))
    }

    fn values(&mut self) -> &mut [f32] {
        match &mut self.values {
            LentValues::InPlace(data) => data.as_mut_slice::<f32>().expect("f32 values"),
            LentValues::Copy(values, ..) => values,
        }
    }

    /// Sends the updated values to the tensor (a dropped tensor takes none).
    fn give_back(self) {
        let data = match self.values {
            LentValues::InPlace(data) => data,
            LentValues::Copy(values, shape, dtype) => {
                TensorData::new(values, shape).convert_dtype(dtype)
            }
        };
        let _ = self.back.send(data);
    }
}

/// A gradient on its way to host memory.
enum Gradient<R> {
    Queued(R, Admitted),
    Read(Vec<f32>),
    /// Already a host tensor (a recomputed block's, its copy queued in the
    /// backward, ahead of this update on the update thread): its values,
    /// read where they are.
    OnHost(Box<dyn FnOnce() -> Arc<TensorData> + Send>),
}

impl<R: QueuedRead> Gradient<R> {
    /// Queues the copy of a device gradient; anything else is read now.
    fn start<B: Backend, T: Transfer<Read = R>, const D: usize>(
        grad: Tensor<OffloadWith<B, T>, D>,
    ) -> Self {
        let numel = grad.shape().num_elements();
        let grad = match grad.into_primitive() {
            TensorPrimitive::Float(OffloadTensor::Device(primitive)) => {
                // Read from a buffer allocated now. A queued read is ordered
                // behind the kernels that made its buffer only as far as
                // the buffer's allocation: burn-optim's clipping scales a
                // gradient in place, and a read of that older buffer raced
                // the scaling (on the H100, losses differed between runs from
                // the first update; with a synchronous read they did not).
                // The copy holds the original, so it cannot run in place.
                let primitive = primitive.into_inner();
                let fresh = B::float_mul_scalar(primitive.clone(), Scalar::Float(1.0));
                drop(primitive);
                let tensor = Tensor::<B, D>::from_primitive(TensorPrimitive::Float(fresh));
                let device = tensor.device();
                let admitted = Admitted::wait(tensor.dtype().size() as u64 * numel as u64);
                match T::start_read(tensor, true) {
                    Ok(read) => {
                        // The kernels it waits for reach the device before
                        // anything waits for the copy.
                        T::flush::<B>(&device);
                        return Gradient::Queued(read, admitted);
                    }
                    Err(tensor) => {
                        let mut values = vec![0.0; numel];
                        T::read_back(tensor, &mut values);
                        return Gradient::Read(values);
                    }
                }
            }
            TensorPrimitive::Float(OffloadTensor::Host(host))
                if host.dtype() == DType::F32 && host.unwritten_fill().is_none() =>
            {
                return Gradient::OnHost(Box::new(move || host.data()));
            }
            primitive => Tensor::<OffloadWith<B, T>, D>::from_primitive(primitive),
        };
        let mut values = vec![0.0; numel];
        read_into::<B, T, D>(grad, &mut values);
        Gradient::Read(values)
    }

    /// Runs `f` on the gradient's values (a queued f32 copy where it landed,
    /// in page-locked memory: the update reads it once, with no copy first).
    fn with_values(self, len: usize, f: impl FnOnce(&[f32])) {
        match self {
            Gradient::Read(values) => f(&values),
            Gradient::OnHost(values) => f(values().as_slice::<f32>().expect("f32 values")),
            Gradient::Queued(read, admitted) => GRADIENT.with_borrow_mut(|scratch| {
                let _admitted = admitted;
                read.finish_with(scratch, len, f)
            }),
        }
    }
}

/// Bytes of gradient copies queued and not yet taken by the update thread:
/// each lands in a page-locked buffer of its own, so the step waits for the
/// update thread before it queues more than [`HOST_GRADIENTS_QUEUED`].
static QUEUED: (Mutex<u64>, Condvar) = (Mutex::new(0), Condvar::new());

/// Most bytes of gradient copies the host optimizer keeps queued for its
/// update thread (each in page-locked host memory until its update).
pub const HOST_GRADIENTS_QUEUED: u64 = 4 << 30;

/// A queued copy's share of [`QUEUED`], given back when dropped (also when
/// its update fails).
struct Admitted(u64);

impl Admitted {
    /// Waits for room for `bytes` (a copy larger than the bound waits for an
    /// empty queue).
    fn wait(bytes: u64) -> Self {
        let (queued, taken) = &QUEUED;
        let mut queued = queued
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while *queued > 0 && *queued + bytes > HOST_GRADIENTS_QUEUED {
            queued = taken
                .wait(queued)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        *queued += bytes;
        Self(bytes)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let (queued, taken) = &QUEUED;
        *queued
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) -= self.0;
        taken.notify_all();
    }
}

thread_local! {
    /// The update thread's buffer for gradients that need widening.
    static GRADIENT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

type Update = Box<dyn FnOnce() + Send>;

/// What the update thread did since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostUpdateStats {
    /// Parameters updated.
    pub updates: u64,
    /// Time spent waiting for gradients to land.
    pub waiting: Duration,
    /// Time spent updating.
    pub updating: Duration,
}

static UPDATE_STATS: Mutex<HostUpdateStats> = Mutex::new(HostUpdateStats {
    updates: 0,
    waiting: Duration::ZERO,
    updating: Duration::ZERO,
});

/// The host optimizer's update thread's counters now.
pub fn host_update_stats() -> HostUpdateStats {
    *UPDATE_STATS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counts one update when dropped: how long it waited, and since when it ran.
struct Timed(Duration, Instant);

impl Drop for Timed {
    fn drop(&mut self) {
        let mut stats = UPDATE_STATS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        stats.updates += 1;
        stats.waiting += self.0;
        stats.updating += self.1.elapsed();
    }
}

/// The thread that runs the updates, in the order the optimizer visits the
/// parameters: the next forward reads the first parameters while the last
/// ones are still being updated.
fn run_on_update_thread(update: Update) {
    static QUEUE: Mutex<Option<Sender<Update>>> = Mutex::new(None);
    let mut queue = QUEUE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let sender = queue.get_or_insert_with(|| {
        let (sender, updates) = channel::<Update>();
        std::thread::Builder::new()
            .name("burn-offload-optim".into())
            .spawn(move || {
                for update in updates {
                    // A failed update drops its senders: the tensors' readers
                    // report it. The thread serves the next ones.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(update));
                }
            })
            .expect("cannot start the host optimizer's thread");
        sender
    });
    sender
        .send(update)
        .expect("the host optimizer's thread is running");
}

/// `tensor` in host memory without waiting for it, where the copy
/// machinery can queue the read: an f32 device tensor's copy is queued behind
/// the kernels that make it and lands on the update thread, in order with
/// the updates, and whatever reads the host tensor waits for it (a
/// checkpoint's stashed input, a recomputed block's parameter gradient).
/// Anything else is read now.
pub(crate) fn park_queued<B: Backend, T: Transfer>(tensor: OffloadTensor<B>) -> OffloadTensor<B> {
    let OffloadTensor::Device(held) = tensor else {
        return tensor;
    };
    let primitive = held.into_inner();
    let (shape, device) = (primitive.shape(), B::float_device(&primitive));
    if primitive.dtype() != DType::F32 {
        return read_to_host::<B, T>(primitive, &device);
    }
    let numel = shape.num_elements();
    // Read from a buffer allocated now, as `Gradient::start` does.
    let flat = B::float_reshape(primitive, Shape::new([numel]));
    let fresh = B::float_mul_scalar(flat, Scalar::Float(1.0));
    let flat = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(fresh));
    let admitted = Admitted::wait(4 * numel as u64);
    match T::start_read(flat, true) {
        Ok(read) => {
            T::flush::<B>(&device);
            let (host, back) =
                HostTensor::pending(shape.clone(), DType::F32, &device, Link::of::<T>());
            run_on_update_thread(Box::new(move || {
                let _admitted = admitted;
                let mut values = vec![0.0f32; numel];
                read.finish(&mut values, false);
                let _ = back.send(TensorData::new(values, shape));
            }));
            OffloadTensor::Host(host)
        }
        Err(flat) => {
            drop(admitted);
            let primitive = B::float_reshape(flat.into_primitive().tensor(), shape);
            read_to_host::<B, T>(primitive, &device)
        }
    }
}

fn read_into<B: Backend, T: Transfer, const D: usize>(
    tensor: Tensor<OffloadWith<B, T>, D>,
    out: &mut [f32],
) {
    match tensor.into_primitive() {
        TensorPrimitive::Float(OffloadTensor::Device(primitive)) => T::read_back(
            Tensor::<B, D>::from_primitive(TensorPrimitive::Float(primitive.into_inner())),
            out,
        ),
        primitive => T::read_back(
            Tensor::<OffloadWith<B, T>, D>::from_primitive(primitive),
            out,
        ),
    }
}

impl<B: Backend, T: Transfer> SimpleOptimizer<OffloadWith<B, T>> for HostOptimizer {
    type State<const D: usize> = HostOptimizerState<OffloadWith<B, T>, D>;

    /// Queues the gradient's copy to the host and the update on the update
    /// thread, and returns at once: the parameter and moments it returns are
    /// host-resident, and whatever reads them waits for their update.
    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<OffloadWith<B, T>, D>,
        grad: Tensor<OffloadWith<B, T>, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<OffloadWith<B, T>, D>, Option<Self::State<D>>) {
        let (shape, device) = (tensor.shape(), tensor.device());
        let len = shape.num_elements();
        // A gradient already in host memory (a recomputed block's) is
        // clipped there, on the update thread: clipping it on the device
        // would page it back in and wait for it.
        let on_host = matches!(
            grad.clone().into_primitive(),
            TensorPrimitive::Float(OffloadTensor::Host(_))
        );
        let (grad, clip_on_host) = match self.clip_norm {
            Some(threshold) if on_host => (grad, Some(threshold)),
            Some(threshold) => (clip_by_norm::<B, T, D>(grad, threshold), None),
            None => (grad, None),
        };
        let gradient = Gradient::start::<B, T, D>(grad);
        let (mut params, tensor) = Lent::take(tensor);
        let ((mut m, moment_1), (mut v, moment_2), time) = match state {
            Some(state) => (
                Lent::take(state.moment_1),
                Lent::take(state.moment_2),
                state.time + 1,
            ),
            // Zero moments give burn-optim's first step exactly (`0 · β + g · (1 − β)`).
            None => (
                Lent::zeros::<B, T, D>(shape.clone(), &device),
                Lent::zeros::<B, T, D>(shape, &device),
                1,
            ),
        };
        let config = self.config;
        run_on_update_thread(Box::new(move || {
            let queued = Instant::now();
            gradient.with_values(len, |grads| {
                let landed = Instant::now();
                let _timed = Timed(landed - queued, landed);
                // burn-optim's factor, `threshold / ‖g‖` where that is below
                // one (its `+ f32::MIN_POSITIVE` vanishes beside any norm
                // that clips).
                // The norm only where clipping is left to this thread: it
                // is a whole pass over the gradient.
                let scale = clip_on_host.map_or(1.0, |threshold| {
                    let norm = sum_of_squares(grads).sqrt();
                    clip_scale(norm, Some(f64::from(threshold))).1 as f32
                });
                config.update(
                    time as u64,
                    lr,
                    scale,
                    UpdateSlices {
                        params: params.values(),
                        moments: MomentSlices::F32 {
                            m: m.values(),
                            v: v.values(),
                        },
                        grads: GradSlice::F32(grads),
                        bf16: None,
                    },
                )
            });
            params.give_back();
            m.give_back();
            v.give_back();
        }));
        let state = HostOptimizerState {
            moment_1,
            moment_2,
            time,
        };
        (tensor, Some(state))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        // On `Offload` a move to the device parks a tensor in host memory.
        HostOptimizerState {
            moment_1: state.moment_1.to_device(device),
            moment_2: state.moment_2.to_device(device),
            time: state.time,
        }
    }
}
