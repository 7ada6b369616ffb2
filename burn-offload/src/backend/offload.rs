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

/// The decorator: `Llama<Offload<Cuda>>` keeps its weights in host memory.
pub struct Offload<B>(PhantomData<B>);

impl<B> Clone for Offload<B> {
    fn clone(&self) -> Self {
        Self(PhantomData)
    }
}
impl<B> Default for Offload<B> {
    fn default() -> Self {
        Self(PhantomData)
    }
}
impl<B: Backend> std::fmt::Debug for Offload<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Offload<{}>", std::any::type_name::<B>())
    }
}

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
    data: TensorData,
    pub(super) device: B::Device,
    on_device: Mutex<Option<B::FloatTensorPrimitive>>,
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
    pub(crate) fn new(data: TensorData, device: &B::Device) -> Arc<Self> {
        Arc::new(Self {
            id: NEXT_HOST_ID.fetch_add(1, Ordering::Relaxed),
            data,
            device: device.clone(),
            on_device: Mutex::new(None),
        })
    }

    pub fn data(&self) -> &TensorData {
        &self.data
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
        let tensor = B::float_from_data(self.data.clone(), &self.device);
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

impl<B: Backend> BackendTypes for Offload<B> {
    type Device = B::Device;
    type FloatTensorPrimitive = OffloadTensor<B>;
    type FloatElem = B::FloatElem;
    type IntTensorPrimitive = B::IntTensorPrimitive;
    type IntElem = B::IntElem;
    type BoolTensorPrimitive = B::BoolTensorPrimitive;
    type BoolElem = B::BoolElem;
    type QuantizedTensorPrimitive = B::QuantizedTensorPrimitive;
}

impl<B: Backend> Backend for Offload<B> {
    fn name(device: &Self::Device) -> String {
        format!("offload<{}>", B::name(device))
    }

    fn seed(device: &Self::Device, seed: u64) {
        super::ops::seed_host_rng(seed);
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
