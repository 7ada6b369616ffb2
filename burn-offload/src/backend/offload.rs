use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use burn::module::{AutodiffModule, ModuleMapper, Param};
use burn::optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use burn::tensor::backend::{
    AutodiffBackend, Backend, BackendTypes, DTypeUsageSet, ExecutionError,
};
use burn::tensor::{DType, Shape, Tensor, TensorData, TensorMetadata};

use super::residency;
use crate::transfer::Transfer;

/// The decorator over backend `B`, its host tensors reaching the device
/// through the copy machinery `T`. Users name it `Offload<B>`, which picks
/// the build's machinery (`Llama<Offload<Cuda>>` keeps its weights in host
/// memory and pages them in by pinned DMA).
pub struct OffloadWith<B, T>(PhantomData<fn() -> (B, T)>);

impl<B, T> Clone for OffloadWith<B, T> {
    fn clone(&self) -> Self {
        Self(PhantomData)
    }
}
impl<B, T> Default for OffloadWith<B, T> {
    fn default() -> Self {
        Self(PhantomData)
    }
}
impl<B: Backend, T> std::fmt::Debug for OffloadWith<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Offload<{}>", std::any::type_name::<B>())
    }
}

/// Uploads bytes (elements of a dtype, a shape) and waits for them to land;
/// `None` where the machinery has no fast path for the backend.
type Upload<B> = fn(
    &[u8],
    DType,
    &[usize],
    &<B as BackendTypes>::Device,
) -> Option<<B as BackendTypes>::FloatTensorPrimitive>;

/// A page-lock guard: the range stays locked while it lives.
type PinGuard = Box<dyn Send + Sync>;

/// Page-locks bytes for the life of the guard.
type Pin<B> = fn(&<B as BackendTypes>::Device, &[u8]) -> Option<PinGuard>;

/// How a host tensor reaches the device: its `OffloadWith`'s copy machinery,
/// as plain functions, so host tensors carry no type of it.
pub(crate) struct Link<B: Backend> {
    upload: Upload<B>,
    pin: Pin<B>,
}

impl<B: Backend> Clone for Link<B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for Link<B> {}

impl<B: Backend> Link<B> {
    /// `T`'s functions for `B`.
    pub(crate) fn of<T: Transfer>() -> Self {
        Self {
            upload: upload_with::<B, T>,
            pin: pin_with::<B, T>,
        }
    }
}

fn upload_with<B: Backend, T: Transfer>(
    bytes: &[u8],
    dtype: DType,
    shape: &[usize],
    device: &B::Device,
) -> Option<B::FloatTensorPrimitive> {
    let numel = shape.iter().product::<usize>();
    let flat = T::upload::<B, 1>(bytes, dtype, &[numel], device)?;
    // The operation that reads it is submitted after this returns.
    T::wait_uploads::<B>(device);
    Some(B::float_reshape(
        flat.into_primitive().tensor(),
        Shape::from(shape.to_vec()),
    ))
}

fn pin_with<B: Backend, T: Transfer>(
    device: &B::Device,
    bytes: &[u8],
) -> Option<Box<dyn Send + Sync>> {
    T::pin::<B>(device, bytes).map(|pin| Box::new(pin) as PinGuard)
}

/// Host tensors smaller than this are uploaded pageable: page-locking costs
/// more than it saves on them.
const PIN_BYTES: usize = 1 << 16;

/// A float tensor of `Offload<B>`.
#[derive(Clone, Debug)]
pub enum OffloadTensor<B: Backend> {
    /// Lives in host memory; paged in when an operation reads it.
    Host(Arc<HostTensor<B>>),
    /// An ordinary tensor of the inner backend.
    Device(B::FloatTensorPrimitive),
}

impl<B: Backend> OffloadTensor<B> {
    /// Whether the tensor is host-resident (not yet paged in).
    pub fn is_host(&self) -> bool {
        matches!(self, OffloadTensor::Host(_))
    }
}

impl<B: Backend> TensorMetadata for OffloadTensor<B> {
    fn dtype(&self) -> DType {
        match self {
            OffloadTensor::Host(h) => h.data.dtype,
            OffloadTensor::Device(t) => t.dtype(),
        }
    }

    fn shape(&self) -> Shape {
        match self {
            OffloadTensor::Host(h) => h.data.shape.clone(),
            OffloadTensor::Device(t) => t.shape(),
        }
    }
}

static NEXT_HOST_ID: AtomicU64 = AtomicU64::new(1);

/// A host-resident tensor and, while cached, its copy on the device.
pub struct HostTensor<B: Backend> {
    id: u64,
    /// Declared before `data`: unlocked before it is freed.
    pinned: Mutex<Option<PinGuard>>,
    data: TensorData,
    pub(super) device: B::Device,
    on_device: Mutex<Option<B::FloatTensorPrimitive>>,
    link: Link<B>,
}

impl<B: Backend> std::fmt::Debug for HostTensor<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTensor")
            .field("id", &self.id)
            .field("shape", &self.data.shape)
            .finish()
    }
}

impl<B: Backend> HostTensor<B> {
    pub(crate) fn new(data: TensorData, device: &B::Device, link: Link<B>) -> Arc<Self> {
        Arc::new(Self {
            id: NEXT_HOST_ID.fetch_add(1, Ordering::Relaxed),
            pinned: Mutex::new(None),
            data,
            device: device.clone(),
            on_device: Mutex::new(None),
            link,
        })
    }

    /// The host values.
    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// The host values to write, when no one else holds the tensor; its
    /// device copy is dropped (page-locking stays: the buffer is the same).
    pub(crate) fn data_mut(self: &mut Arc<Self>) -> Option<&mut TensorData> {
        if Arc::strong_count(self) != 1 {
            return None;
        }
        // The cache's weak reference goes with the device copy.
        if self
            .on_device
            .lock()
            .expect("residency lock")
            .take()
            .is_some()
        {
            residency::forget(self.id);
        }
        Arc::get_mut(self).map(|this| &mut this.data)
    }

    fn bytes(&self) -> u64 {
        self.data.bytes.len() as u64
    }

    /// The device copy, uploading (and caching) it if needed.
    fn page_in(self: &Arc<Self>) -> B::FloatTensorPrimitive {
        if let Some(t) = self.on_device.lock().expect("residency lock").as_ref() {
            residency::touch(self.id);
            return t.clone();
        }
        let bytes = self.data.as_bytes();
        if bytes.len() >= PIN_BYTES {
            let mut pinned = self.pinned.lock().expect("pin lock");
            if pinned.is_none() {
                *pinned = (self.link.pin)(&self.device, bytes);
            }
        }
        let tensor = (self.link.upload)(bytes, self.data.dtype, &self.data.shape, &self.device)
            .unwrap_or_else(|| B::float_from_data(self.data.clone(), &self.device));
        *self.on_device.lock().expect("residency lock") = Some(tensor.clone());
        let weak: std::sync::Weak<dyn residency::Evict> = Arc::downgrade(self) as _;
        residency::paged_in(self.id, self.bytes(), weak);
        tensor
    }
}

impl<B: Backend> residency::Evict for HostTensor<B> {
    fn evict(&self) -> bool {
        self.on_device
            .lock()
            .expect("residency lock")
            .take()
            .is_some()
    }
}

impl<B: Backend> Drop for HostTensor<B> {
    fn drop(&mut self) {
        if self
            .on_device
            .get_mut()
            .map(|t| t.is_some())
            .unwrap_or(false)
        {
            residency::forget(self.id);
        }
    }
}

/// An operand as the inner backend sees it (paged in if host-resident).
pub(crate) fn lower<B: Backend>(tensor: OffloadTensor<B>) -> B::FloatTensorPrimitive {
    match tensor {
        OffloadTensor::Host(h) => h.page_in(),
        OffloadTensor::Device(t) => t,
    }
}

impl<B: Backend, T: Transfer> BackendTypes for OffloadWith<B, T> {
    type Device = B::Device;
    type FloatTensorPrimitive = OffloadTensor<B>;
    type FloatElem = B::FloatElem;
    type IntTensorPrimitive = B::IntTensorPrimitive;
    type IntElem = B::IntElem;
    type BoolTensorPrimitive = B::BoolTensorPrimitive;
    type BoolElem = B::BoolElem;
    type QuantizedTensorPrimitive = B::QuantizedTensorPrimitive;
}

impl<B: Backend, T: Transfer> Backend for OffloadWith<B, T> {
    fn name(device: &Self::Device) -> String {
        format!("offload<{}>", B::name(device))
    }

    fn seed(device: &Self::Device, seed: u64) {
        super::draw::seed_host_rng(seed);
        B::seed(device, seed);
    }

    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        B::sync(device)
    }

    fn memory_cleanup(device: &Self::Device) {
        B::memory_cleanup(device)
    }

    fn dtype_usage(device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        B::device_count(type_id)
    }
}

/// Moves every float parameter of a module to host memory (a no-op for those
/// already there). Works on the inner tensors, so parameters stay graph leaves.
pub struct ParkParams;

impl<AB: AutodiffBackend> ModuleMapper<AB> for ParkParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AB, D>>) -> Param<Tensor<AB, D>> {
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let device = tensor.device();
        let parked =
            Tensor::from_inner(tensor.inner().to_device(&device)).set_require_grad(require_grad);
        Param::from_mapped_value(id, parked, mapper)
    }
}

/// Wraps a burn optimizer so that after every step the module's parameters
/// are host-resident again (`Autodiff<Offload<B>>` training with burn-optim).
/// The optimizer's own state is parked too: burn-optim moves it to the
/// parameter's device at each step, which on `Offload` means host memory.
#[derive(Clone)]
pub struct HostParams<O>(pub O);

impl<O, M, AB> Optimizer<M, AB> for HostParams<O>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
    O: Optimizer<M, AB>,
{
    type Record = O::Record;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        self.0.step(lr, module, grads).map(&mut ParkParams)
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        self.0.step_multi(lr, module, grads).map(&mut ParkParams)
    }

    fn to_record(&self) -> Self::Record {
        self.0.to_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self(self.0.load_record(record))
    }
}
