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
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use super::Offload;
use crate::host::optim::{AdamWConfig, OptimizerConfig, SgdConfig, UpdateSlices};

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
    pub fn init<B, AB, M>(&self) -> OptimizerAdaptor<HostOptimizer, M, AB>
    where
        B: Backend,
        AB: AutodiffBackend<InnerBackend = Offload<B>>,
        M: AutodiffModule<AB>,
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

/// `tensor`'s values as f32 on the host (a host-resident tensor's own bytes).
fn host_values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 values")
}

impl<B: Backend> SimpleOptimizer<Offload<B>> for HostOptimizer {
    type State<const D: usize> = HostOptimizerState<Offload<B>, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<Offload<B>, D>,
        grad: Tensor<Offload<B>, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<Offload<B>, D>, Option<Self::State<D>>) {
        let (shape, device, dtype) = (tensor.shape(), tensor.device(), tensor.dtype());
        let mut params = host_values(tensor);
        let grads = host_values(grad);
        let (mut m, mut v, time) = match state {
            Some(state) => (
                host_values(state.moment_1),
                host_values(state.moment_2),
                state.time + 1,
            ),
            // Zero moments give burn-optim's first step exactly (`0 · β + g · (1 − β)`).
            None => (vec![0.0; params.len()], vec![0.0; params.len()], 1),
        };
        self.config.update(
            time as u64,
            lr,
            1.0,
            UpdateSlices {
                params: &mut params,
                m: &mut m,
                v: &mut v,
                grads: &grads,
                bf16: None,
            },
        );
        // `from_data` on `Offload` makes host-resident tensors.
        let host = |values: Vec<f32>, dtype| {
            Tensor::<Offload<B>, D>::from_data(
                TensorData::new(values, shape.clone()).convert_dtype(dtype),
                &device,
            )
        };
        let state = HostOptimizerState {
            moment_1: host(m, burn::tensor::DType::F32),
            moment_2: host(v, burn::tensor::DType::F32),
            time,
        };
        (host(params, dtype), Some(state))
    }

    fn to_device<const D: usize>(
        state: Self::State<D>,
        device: &<Offload<B> as burn::tensor::backend::BackendTypes>::Device,
    ) -> Self::State<D> {
        // On `Offload` a move to the device parks a tensor in host memory.
        HostOptimizerState {
            moment_1: state.moment_1.to_device(device),
            moment_2: state.moment_2.to_device(device),
            time: state.time,
        }
    }
}
