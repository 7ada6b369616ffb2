use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, Weak};

use burn::module::{AutodiffModule, ModuleMapper, Param};
use burn::optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use burn::tensor::backend::{
    AutodiffBackend, Backend, BackendTypes, DTypeUsageSet, ExecutionError,
};
use burn::tensor::{DType, FloatDType, Scalar, Shape, Tensor, TensorData, TensorMetadata};

use super::{prefetch, residency};
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

/// A copy in flight, or a page-lock: whatever it guards lasts while it lives.
type Guard = Box<dyn Send + Sync>;

/// Starts uploading bytes (elements of a dtype, a shape), the device's later
/// work ordered behind the copy; the guard keeps the copy's source in use.
/// `None` where the machinery has no fast path for the backend.
type Upload<B> = fn(
    &[u8],
    DType,
    &[usize],
    &<B as BackendTypes>::Device,
) -> Option<(<B as BackendTypes>::FloatTensorPrimitive, Guard)>;

/// Page-locks bytes for the life of the guard.
type Pin<B> = fn(&<B as BackendTypes>::Device, &[u8]) -> Option<Guard>;

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
) -> Option<(B::FloatTensorPrimitive, Guard)> {
    let numel = shape.iter().product::<usize>();
    let (flat, in_flight) = T::upload_ordered::<B, 1>(bytes, dtype, &[numel], device)?;
    let tensor = B::float_reshape(flat.into_primitive().tensor(), Shape::from(shape.to_vec()));
    Some((tensor, Box::new(in_flight) as Guard))
}

fn pin_with<B: Backend, T: Transfer>(device: &B::Device, bytes: &[u8]) -> Option<Guard> {
    T::pin::<B>(device, bytes).map(|pin| Box::new(pin) as Guard)
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
    Device(Held<B>),
}

impl<B: Backend> OffloadTensor<B> {
    /// Whether the tensor is host-resident (not yet paged in).
    pub fn is_host(&self) -> bool {
        matches!(self, OffloadTensor::Host(_))
    }

    /// A device tensor, counted while it lives.
    pub(crate) fn device(tensor: B::FloatTensorPrimitive) -> Self {
        OffloadTensor::Device(Held::new(tensor))
    }
}

/// A tensor of the inner backend, counted in [`residency::stats`]'s device
/// bytes while it or a clone of it lives.
#[derive(Clone, Debug)]
pub struct Held<B: Backend> {
    tensor: B::FloatTensorPrimitive,
    count: Arc<HeldBytes>,
}

/// The bytes a [`Held`] and its clones count; uncounted when the last goes.
#[derive(Debug)]
struct HeldBytes(u64);

impl Drop for HeldBytes {
    fn drop(&mut self) {
        residency::release(self.0);
    }
}

impl<B: Backend> Held<B> {
    fn new(tensor: B::FloatTensorPrimitive) -> Self {
        let bytes = (tensor.shape().num_elements() * tensor.dtype().size()) as u64;
        residency::hold(bytes);
        Self {
            tensor,
            count: Arc::new(HeldBytes(bytes)),
        }
    }

    /// The inner tensor.
    pub fn tensor(&self) -> &B::FloatTensorPrimitive {
        &self.tensor
    }

    /// The inner tensor, no longer counted: an operation consumes it.
    pub fn into_inner(self) -> B::FloatTensorPrimitive {
        drop(self.count);
        self.tensor
    }
}

impl<B: Backend> TensorMetadata for OffloadTensor<B> {
    fn dtype(&self) -> DType {
        match self {
            OffloadTensor::Host(h) => h.dtype(),
            OffloadTensor::Device(t) => t.tensor().dtype(),
        }
    }

    fn shape(&self) -> Shape {
        match self {
            OffloadTensor::Host(h) => h.shape(),
            OffloadTensor::Device(t) => t.tensor().shape(),
        }
    }
}

static NEXT_HOST_ID: AtomicU64 = AtomicU64::new(1);

/// A tensor of one repeated value (`zeros`, `ones`, `full`): its host values
/// are written only if the host asks for them, and it is filled on the device
/// where an operation reads it. Autodiff's backward creates such tensors at
/// activation sizes; made on the host they would cost a host fill and a copy
/// each.
#[derive(Debug, Clone)]
pub(crate) struct Fill {
    pub(crate) value: Scalar,
    pub(crate) shape: Shape,
    pub(crate) dtype: FloatDType,
}

/// A host tensor's values, or where they will come from.
enum Values {
    Ready(Arc<TensorData>),
    Fill(Fill),
    /// An update running on the host (the host optimizer's): the values it
    /// sends back when done.
    Pending(Receiver<TensorData>),
}

/// A host-resident tensor and, while cached, its copy on the device.
pub struct HostTensor<B: Backend> {
    id: u64,
    /// Declared first, so dropped first: a copy in flight from the values
    /// has landed before they are unlocked or freed.
    in_flight: Mutex<Option<Guard>>,
    /// Declared before `values`: unlocked before they are freed.
    pinned: Mutex<Option<Guard>>,
    values: Mutex<Values>,
    shape: Shape,
    dtype: DType,
    pub(super) device: B::Device,
    on_device: Mutex<Option<B::FloatTensorPrimitive>>,
    link: Link<B>,
}

impl<B: Backend> std::fmt::Debug for HostTensor<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTensor")
            .field("id", &self.id)
            .field("shape", &self.shape)
            .finish()
    }
}

impl<B: Backend> HostTensor<B> {
    pub(crate) fn new(data: TensorData, device: &B::Device, link: Link<B>) -> Arc<Self> {
        let (shape, dtype) = (data.shape.clone(), data.dtype);
        Self::with(Values::Ready(Arc::new(data)), shape, dtype, device, link)
    }

    pub(crate) fn filled(fill: Fill, device: &B::Device, link: Link<B>) -> Arc<Self> {
        let (shape, dtype) = (fill.shape.clone(), fill.dtype.into());
        Self::with(Values::Fill(fill), shape, dtype, device, link)
    }

    /// A tensor whose values an update on the host will send through the
    /// returned sender; its readers wait for them.
    pub(crate) fn pending(
        shape: Shape,
        dtype: DType,
        device: &B::Device,
        link: Link<B>,
    ) -> (Arc<Self>, Sender<TensorData>) {
        let (send, receive) = channel();
        let host = Self::with(Values::Pending(receive), shape, dtype, device, link);
        (host, send)
    }

    fn with(
        values: Values,
        shape: Shape,
        dtype: DType,
        device: &B::Device,
        link: Link<B>,
    ) -> Arc<Self> {
        Arc::new(Self {
            id: NEXT_HOST_ID.fetch_add(1, Ordering::Relaxed),
            in_flight: Mutex::new(None),
            pinned: Mutex::new(None),
            values: Mutex::new(values),
            shape,
            dtype,
            device: device.clone(),
            on_device: Mutex::new(None),
            link,
        })
    }

    fn values(&self) -> std::sync::MutexGuard<'_, Values> {
        self.values.lock().expect("values lock")
    }

    /// The host values (waiting for an update in progress, if any).
    pub fn data(&self) -> Arc<TensorData> {
        let mut values = self.values();
        let data = match &*values {
            Values::Ready(data) => return data.clone(),
            Values::Fill(fill) => {
                TensorData::full_dtype(fill.shape.clone(), fill.value, fill.dtype.into())
            }
            Values::Pending(update) => update
                .recv()
                .expect("the host update of an Offload tensor failed (see its panic above)"),
        };
        let data = Arc::new(data);
        *values = Values::Ready(data.clone());
        data
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape.clone()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// A fill whose host values were never asked for.
    pub(super) fn unwritten_fill(&self) -> Option<Fill> {
        match &*self.values() {
            Values::Fill(fill) => Some(fill.clone()),
            _ => None,
        }
    }

    /// Whether the values can be read without waiting: an update that has
    /// sent them back counts (they are taken now).
    fn is_ready(&self) -> bool {
        let mut values = self.values();
        let Values::Pending(update) = &*values else {
            return true;
        };
        match update.try_recv() {
            Ok(data) => {
                *values = Values::Ready(Arc::new(data));
                true
            }
            // Still running, or failed: a reader reports the failure.
            Err(_) => false,
        }
    }

    /// Lends the values to an update that sends them back through the
    /// returned sender, when no other tensor shares them; until it does, the
    /// tensor's readers wait for them (its shape and dtype stay readable).
    /// The device copy is dropped; the page-lock stays (the buffer is the
    /// same).
    pub(crate) fn lend(self: &Arc<Self>) -> Option<(TensorData, Sender<TensorData>)> {
        if Arc::strong_count(self) != 1 {
            return None;
        }
        let data = self.data();
        // No copy reads the values any more.
        drop(self.in_flight.lock().expect("in-flight lock").take());
        drop(data);
        let mut values = self.values();
        match &*values {
            // A reader holds them (a copy being taken): not lent.
            Values::Ready(data) if Arc::strong_count(data) == 1 => {}
            _ => return None,
        }
        let (send, receive) = channel();
        let Values::Ready(data) = std::mem::replace(&mut *values, Values::Pending(receive)) else {
            unreachable!("matched above");
        };
        let data = Arc::try_unwrap(data).expect("no other reader: checked under the lock");
        drop(values);
        if self
            .on_device
            .lock()
            .expect("residency lock")
            .take()
            .is_some()
        {
            residency::forget(self.id);
        }
        Some((data, send))
    }

    fn bytes(&self) -> u64 {
        (self.shape.num_elements() * self.dtype.size()) as u64
    }

    /// The device copy for an operation: filled there for an unwritten fill,
    /// else the cached copy or a fresh upload, recorded in the page-in trace
    /// (which may start copies of the tensors it expects next).
    fn page_in(self: &Arc<Self>) -> B::FloatTensorPrimitive {
        if let Some(fill) = self.unwritten_fill() {
            return B::float_full(fill.shape, fill.value, &self.device, fill.dtype);
        }
        let weak: Weak<dyn residency::Resident> = Arc::downgrade(self) as _;
        prefetch::accessed(self.id, self.bytes(), weak);
        self.copy_in()
    }

    /// A device copy that the page cache never holds nor the page-in trace
    /// records: for a tensor read once (a checkpoint's stashed input), which
    /// must not evict the weights.
    fn upload_uncached(&self) -> B::FloatTensorPrimitive {
        if let Some(fill) = self.unwritten_fill() {
            return B::float_full(fill.shape, fill.value, &self.device, fill.dtype);
        }
        if let Some(t) = self.on_device.lock().expect("residency lock").as_ref() {
            return t.clone();
        }
        self.upload(&self.data())
    }

    /// Uploads `data` (this tensor's values), keeping the copy in flight
    /// until it lands: the values are dropped with this tensor, after it.
    fn upload(&self, data: &TensorData) -> B::FloatTensorPrimitive {
        match (self.link.upload)(data.as_bytes(), data.dtype, &data.shape, &self.device) {
            Some((tensor, in_flight)) => {
                // The copy before this one from the same bytes landed long ago.
                *self.in_flight.lock().expect("in-flight lock") = Some(in_flight);
                tensor
            }
            None => B::float_from_data(data.clone(), &self.device),
        }
    }

    /// The cached device copy, or a fresh upload (cached).
    fn copy_in(self: &Arc<Self>) -> B::FloatTensorPrimitive {
        if let Some(t) = self.on_device.lock().expect("residency lock").as_ref() {
            residency::touch(self.id);
            return t.clone();
        }
        let data = self.data();
        let bytes = data.as_bytes();
        if bytes.len() >= PIN_BYTES {
            let mut pinned = self.pinned.lock().expect("pin lock");
            if pinned.is_none() {
                *pinned = (self.link.pin)(&self.device, bytes);
            }
        }
        let tensor = self.upload(&data);
        *self.on_device.lock().expect("residency lock") = Some(tensor.clone());
        let weak: Weak<dyn residency::Resident> = Arc::downgrade(self) as _;
        residency::paged_in(self.id, self.bytes(), weak);
        tensor
    }
}

impl<B: Backend> residency::Resident for HostTensor<B> {
    fn evict(&self) -> bool {
        self.on_device
            .lock()
            .expect("residency lock")
            .take()
            .is_some()
    }

    fn prefetch(self: Arc<Self>) -> bool {
        if !self.is_ready() || self.unwritten_fill().is_some() {
            return false;
        }
        let cached = self.on_device.lock().expect("residency lock").is_some();
        if cached {
            // Kept over what was used longer ago.
            residency::touch(self.id);
        } else {
            self.copy_in();
        }
        !cached
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
        OffloadTensor::Device(t) => t.into_inner(),
    }
}

/// A device tensor's values read back (waiting for them) into a host tensor
/// of `device`.
pub(crate) fn read_to_host<B: Backend, T: Transfer>(
    tensor: B::FloatTensorPrimitive,
    device: &B::Device,
) -> OffloadTensor<B> {
    let data = burn::tensor::try_read_sync(B::float_into_data(tensor))
        .expect("reading a device tensor back to the host must be possible on this platform")
        .unwrap_or_else(|err| panic!("cannot move a tensor to host memory: {err}"));
    OffloadTensor::Host(HostTensor::new(data, device, Link::of::<T>()))
}

/// `tensor` on the device, a host one uploaded outside the page cache and
/// its trace (see [`HostTensor::upload_uncached`]).
pub(crate) fn to_device_uncached<B: Backend>(tensor: OffloadTensor<B>) -> OffloadTensor<B> {
    match tensor {
        OffloadTensor::Host(h) => OffloadTensor::device(h.upload_uncached()),
        device => device,
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
/// Each step also ends a step of the page-in trace ([`super::prefetch`]).
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
        let module = self.0.step(lr, module, grads).map(&mut ParkParams);
        prefetch::end_step();
        module
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        let module = self.0.step_multi(lr, module, grads).map(&mut ParkParams);
        prefetch::end_step();
        module
    }

    fn to_record(&self) -> Self::Record {
        self.0.to_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self(self.0.load_record(record))
    }
}
