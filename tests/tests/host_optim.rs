//! The host optimizers of `Autodiff<Offload<B>>`: an unchanged burn model
//! trained with `HostOptimizerConfig` (AdamW or SGD on the host, burn-optim's
//! clipping) follows `Autodiff<B>` with burn-optim's own optimizer, and its
//! parameters are host-resident between steps.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamWConfig as BurnAdamW, Optimizer, SgdConfig as BurnSgd};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn_offload::{AdamWConfig, HostOptimizerConfig, SgdConfig};
use burn_offload_tests::{
    tiny_llama_pair, train_side_by_side, ReadParams, TestAutodiff as Reference, WriteParams,
};
use models::{Llama, LlamaConfig};

type Off = burn_offload_tests::OffloadAutodiff;

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

/// Trains the tiny Llama `steps` steps both ways from the same weights:
/// losses and final parameters agree, parameters host-resident after every step.
fn follows_burn<O, R>(optim: O, ref_optim: R, steps: u64, lr: f64)
where
    O: Optimizer<Llama<Off>, Off>,
    R: Optimizer<Llama<Reference>, Reference>,
{
    let (model, reference) = tiny_llama_pair();
    train_side_by_side(
        model,
        reference,
        optim,
        ref_optim,
        steps,
        lr,
        |step, model| {
            let mut on_device = OnDevice(0);
            model.visit(&mut on_device);
            assert_eq!(on_device.0, 0, "step {step}: parameters left on the device");
        },
    );
}

/// Norm clipping on the device, as burn-optim clips: the blocks in one
/// graph (`set_offload_recompute(false)`), so every gradient reaches the
/// optimizer on the device and its norm is summed as burn sums it.
#[test]
fn host_adamw_with_clipping_follows_burn_optim_adamw() {
    burn_offload::set_offload_recompute(false);
    let (optim, reference) = adamw_clipped_at(0.5);
    follows_burn(optim, reference, 20, 1e-2);
    burn_offload::set_offload_recompute(true);
}

/// Norm clipping of the recomputed blocks' gradients, which reach the
/// optimizer in host memory and are clipped there (the norm summed in f64,
/// in parallel): the same trajectory over 5 steps. Over 20 the summation
/// order's last bits, which Adam's `m / √v` amplifies for near-zero
/// gradients, move a parameter by 1e-4.
#[test]
fn host_adamw_clips_recomputed_gradients_on_the_host() {
    let (optim, reference) = adamw_clipped_at(0.5);
    follows_burn(optim, reference, 5, 1e-2);
}

/// The host AdamW and burn-optim's, weight decay 0.01, norm clipping at
/// `threshold`.
fn adamw_clipped_at(
    threshold: f32,
) -> (
    impl Optimizer<Llama<Off>, Off>,
    impl Optimizer<Llama<Reference>, Reference>,
) {
    let clip = Some(GradientClippingConfig::Norm(threshold));
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
    (optim, reference)
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

/// burn's activation checkpointing over `Offload`: the graph recomputes
/// what it dropped, and the host AdamW still follows plain burn under the
/// same strategy.
#[test]
fn host_adamw_under_balanced_checkpointing_follows_burn_optim_adamw() {
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    type Ckpt = burn::backend::Autodiff<
        burn_offload::Offload<burn_offload_tests::TestBackend>,
        BalancedCheckpointing,
    >;
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let model = config.init::<Ckpt>(&device);
    let mut values = ReadParams(Vec::new());
    model.visit(&mut values);
    // Plain burn with the same strategy: the same formulation of every op.
    type RefCkpt = burn::backend::Autodiff<burn_offload_tests::TestBackend, BalancedCheckpointing>;
    let reference = config
        .init::<RefCkpt>(&device)
        .map(&mut WriteParams(values.0.into_iter()));
    let optim = HostOptimizerConfig::default().init::<Ckpt, Llama<Ckpt>>();
    let ref_optim = BurnAdamW::new().init::<RefCkpt, Llama<RefCkpt>>();
    train_side_by_side(model, reference, optim, ref_optim, 10, 1e-2, |_, _| {});
}
