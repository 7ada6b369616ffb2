//! The host optimizers of `Autodiff<Offload<B>>`: an unchanged burn model
//! trained with `HostOptimizerConfig` (AdamW or SGD on the host, burn-optim's
//! clipping) follows `Autodiff<B>` with burn-optim's own optimizer, and its
//! parameters are host-resident between steps.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamWConfig as BurnAdamW, GradientsParams, Optimizer, SgdConfig as BurnSgd};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn_offload::{AdamWConfig, BlockModel, HostOptimizerConfig, Offload, SgdConfig};
use burn_offload_tests::{
    data_rel_err, random_tokens, ReadParams, TestAutodiff as Reference, TestBackend as B,
    WriteParams,
};
use models::{cross_entropy, Llama, LlamaConfig};

type Off = burn::backend::Autodiff<Offload<B>>;

/// Parameters not host-resident.
struct OnDevice(usize);
impl ModuleVisitor<Off> for OnDevice {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Off, D>>) {
        match param.val().inner().into_primitive() {
            TensorPrimitive::Float(t) if t.is_host() => {}
            _ => self.0 += 1,
        }
    }
}

/// Trains the tiny Llama `steps` steps both ways from the same weights and
/// checks losses, residency and the final parameters.
fn follows_burn<O, R>(mut optim: O, mut ref_optim: R, steps: u64, lr: f64)
where
    O: Optimizer<Llama<Off>, Off>,
    R: Optimizer<Llama<Reference>, Reference>,
{
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let mut model = config.init::<Off>(&device);
    let mut values = ReadParams(Vec::new());
    model.visit(&mut values);
    let mut reference = config
        .init::<Reference>(&device)
        .map(&mut WriteParams(values.0.into_iter()));
    for step in 0..steps {
        let tokens = random_tokens::<B>(2, 17, config.vocab_size, step, &device);
        let (x, y) = (tokens.clone().narrow(1, 0, 16), tokens.narrow(1, 1, 16));

        let loss = cross_entropy(
            model.forward(Tensor::from_data(x.to_data(), &device)),
            Tensor::from_data(y.to_data(), &device),
        );
        let loss_value = loss.clone().into_scalar();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);

        let ref_loss = cross_entropy(
            reference.forward(Tensor::from_inner(x)),
            Tensor::from_inner(y),
        );
        let ref_value = ref_loss.clone().into_scalar();
        let grads = GradientsParams::from_grads(ref_loss.backward(), &reference);
        reference = ref_optim.step(lr, reference, grads);

        assert!(
            ((loss_value - ref_value) / ref_value).abs() <= 1e-5,
            "step {step}: {loss_value} vs {ref_value}"
        );
        let mut on_device = OnDevice(0);
        model.visit(&mut on_device);
        assert_eq!(on_device.0, 0, "step {step}: parameters left on the device");
    }
    let (mut got, mut want) = (ReadParams(Vec::new()), ReadParams(Vec::new()));
    model.visit(&mut got);
    reference.visit(&mut want);
    for (i, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
        let err = data_rel_err(g, w);
        assert!(err <= 1e-5, "parameter {i}: relative error {err}");
    }
}

#[test]
fn host_adamw_with_clipping_follows_burn_optim_adamw() {
    let clip = Some(GradientClippingConfig::Norm(0.5));
    let optim = HostOptimizerConfig::adamw(AdamWConfig {
        weight_decay: 0.01,
        ..Default::default()
    })
    .with_grad_clipping(clip.clone())
    .init::<Off, Llama<Off>>();
    let reference = BurnAdamW::new()
        .with_weight_decay(0.01)
        .with_grad_clipping(clip)
        .init::<Reference, Llama<Reference>>();
    follows_burn(optim, reference, 20, 1e-2);
}

#[test]
fn host_sgd_with_momentum_follows_burn_optim_sgd() {
    let clip = Some(GradientClippingConfig::Value(0.05));
    let optim = HostOptimizerConfig::sgd(SgdConfig {
        momentum: 0.9,
        weight_decay: 0.01,
    })
    .with_grad_clipping(clip.clone())
    .init::<Off, Llama<Off>>();
    let reference = BurnSgd::new()
        .with_momentum(Some(MomentumConfig {
            momentum: 0.9,
            dampening: 0.0,
            nesterov: false,
        }))
        .with_weight_decay(Some(WeightDecayConfig { penalty: 0.01 }))
        .with_gradient_clipping(clip)
        .init::<Reference, Llama<Reference>>();
    follows_burn(optim, reference, 20, 1e-2);
}
