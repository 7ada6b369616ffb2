//! Optimizers for `Autodiff<Offload<B>>` that run on the host: each
//! parameter's gradient comes to host memory, the parameter and its moments
//! are updated there with the engine's fused loops (`host::optim`), and the
//! optimizer state never visits the device.
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
use std::sync::Arc;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Shape, Tensor, TensorData, TensorPrimitive};

use super::{HostTensor, OffloadTensor, OffloadWith};
use crate::host::optim::{AdamWConfig, OptimizerConfig, SgdConfig, UpdateSlices};
use crate::transfer::Transfer;

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

    /// The optimizer for module `M` of `Autodiff<Offload<B>>` (`AB`).
    pub fn init<AB, M>(&self) -> OptimizerAdaptor<HostOptimizer, M, AB>
    where
        AB: AutodiffBackend,
        M: AutodiffModule<AB>,
        HostOptimizer: SimpleOptimizer<AB::InnerBackend>,
    {
        let mut optim = OptimizerAdaptor::from(HostOptimizer {
            config: self.optimizer,
        });
        if let Some(clipping) = &self.grad_clipping {
            optim = optim.with_grad_clipping(clipping.init());
        }
        optim
    }
}

/// The per-parameter step of [`HostOptimizerConfig`] (see the module docs).
#[derive(Debug, Clone)]
pub struct HostOptimizer {
    config: OptimizerConfig,
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

/// A tensor's values on the host for the update: in place in its host
/// buffer where the tensor is host-resident, f32 and held by no one else
/// (the buffer stays page-locked, nothing is allocated), else a copy.
enum HostValues<B: Backend> {
    InPlace(Arc<HostTensor<B>>),
    Copy(Vec<f32>, Shape, DType),
}

impl<B: Backend> HostValues<B> {
    fn take<T: Transfer, const D: usize>(tensor: Tensor<OffloadWith<B, T>, D>) -> Self {
        let (shape, dtype) = (tensor.shape(), tensor.dtype());
        let primitive = match tensor.into_primitive() {
            TensorPrimitive::Float(OffloadTensor::Host(mut host)) if dtype == DType::F32 => {
                if host.data_mut().is_some() {
                    return HostValues::InPlace(host);
                }
                TensorPrimitive::Float(OffloadTensor::Host(host))
            }
            primitive => primitive,
        };
        let tensor = Tensor::<OffloadWith<B, T>, D>::from_primitive(primitive);
        let mut values = vec![0.0; shape.num_elements()];
        read_into::<B, T, D>(tensor, &mut values);
        HostValues::Copy(values, shape, dtype)
    }

    fn zeros(shape: Shape) -> Self {
        HostValues::Copy(vec![0.0; shape.num_elements()], shape, DType::F32)
    }

    fn values(&mut self) -> &mut [f32] {
        match self {
            HostValues::InPlace(host) => host
                .data_mut()
                .expect("held by no one else")
                .as_mut_slice::<f32>()
                .expect("f32 values"),
            HostValues::Copy(values, ..) => values,
        }
    }

    fn into_tensor<T: Transfer, const D: usize>(
        self,
        device: &B::Device,
    ) -> Tensor<OffloadWith<B, T>, D> {
        match self {
            HostValues::InPlace(host) => {
                Tensor::from_primitive(TensorPrimitive::Float(OffloadTensor::Host(host)))
            }
            // `from_data` on `Offload` makes a host-resident tensor.
            HostValues::Copy(values, shape, dtype) => {
                Tensor::from_data(TensorData::new(values, shape).convert_dtype(dtype), device)
            }
        }
    }
}

/// Copies `tensor`'s values into `out` as f32: a device tensor through `T`'s
/// read-back (page-locked staging on CUDA), a host-resident one from its bytes.
fn read_into<B: Backend, T: Transfer, const D: usize>(
    tensor: Tensor<OffloadWith<B, T>, D>,
    out: &mut [f32],
) {
    match tensor.into_primitive() {
        TensorPrimitive::Float(OffloadTensor::Device(primitive)) => T::read_back(
            Tensor::<B, D>::from_primitive(TensorPrimitive::Float(primitive)),
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

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<OffloadWith<B, T>, D>,
        grad: Tensor<OffloadWith<B, T>, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<OffloadWith<B, T>, D>, Option<Self::State<D>>) {
        let (shape, device) = (tensor.shape(), tensor.device());
        let mut grads = vec![0.0; shape.num_elements()];
        read_into::<B, T, D>(grad, &mut grads);
        let mut params = HostValues::take(tensor);
        let (mut m, mut v, time) = match state {
            Some(state) => (
                HostValues::take(state.moment_1),
                HostValues::take(state.moment_2),
                state.time + 1,
            ),
            // Zero moments give burn-optim's first step exactly (`0 · β + g · (1 − β)`).
            None => (
                HostValues::zeros(shape.clone()),
                HostValues::zeros(shape),
                1,
            ),
        };
        self.config.update(
            time as u64,
            lr,
            1.0,
            UpdateSlices {
                params: params.values(),
                m: m.values(),
                v: v.values(),
                grads: &grads,
                bf16: None,
            },
        );
        let state = HostOptimizerState {
            moment_1: m.into_tensor(&device),
            moment_2: v.into_tensor(&device),
            time,
        };
        (params.into_tensor(&device), Some(state))
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
