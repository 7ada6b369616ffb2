//! `Offload<B>` as a drop-in backend: an unchanged burn model trained with
//! `Autodiff<Offload<B>>` + burn-optim matches `Autodiff<B>`, and its weights
//! live in host memory between steps. One test: the residency counters are
//! process-wide.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn_offload::residency::{self, set_param_cache_bytes};
use burn_offload::{BlockModel, HostParams, Offload};
use burn_offload_tests::{
    data_rel_err, random_tokens, ReadParams, TestAutodiff as Reference, TestBackend as B,
    WriteParams,
};
use models::{cross_entropy, Llama, LlamaConfig};

type Off = burn::backend::Autodiff<Offload<B>>;

/// Counts parameters that are (not) host-resident.
struct Residency {
    host: usize,
    device: usize,
}
impl ModuleVisitor<Off> for Residency {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Off, D>>) {
        match param.val().inner().into_primitive() {
            TensorPrimitive::Float(t) if t.is_host() => self.host += 1,
            _ => self.device += 1,
        }
    }
}

fn residency(model: &Llama<Off>) -> (usize, usize) {
    let mut r = Residency { host: 0, device: 0 };
    model.visit(&mut r);
    (r.host, r.device)
}

#[test]
fn autodiff_offload_trains_an_unchanged_model_like_plain_burn() {
    let device = Default::default();
    let config = LlamaConfig::tiny();

    // Initialisation on Offload leaves every parameter in host memory.
    let mut model = config.init::<Off>(&device);
    let mut values = ReadParams(Vec::new());
    model.visit(&mut values);
    let (host, on_device) = residency(&model);
    assert_eq!(
        on_device, 0,
        "{on_device} parameters initialised on the device"
    );
    assert_eq!(host, values.0.len());

    // The reference starts from the same weights.
    let mut reference = config
        .init::<Reference>(&device)
        .map(&mut WriteParams(values.0.into_iter()));

    // A cache of about two blocks' weights bounds what stays on the device.
    let block_bytes = (model.blocks()[0].num_params() * 4) as u64;
    set_param_cache_bytes(2 * block_bytes);
    let largest = (config.vocab_size * config.d_model * 4) as u64;

    let mut optim = HostParams(
        AdamWConfig::new()
            .with_weight_decay(0.01)
            .init::<Off, Llama<Off>>(),
    );
    let mut ref_optim = AdamWConfig::new()
        .with_weight_decay(0.01)
        .init::<Reference, Llama<Reference>>();
    for step in 0..5 {
        let tokens = random_tokens::<B>(2, 17, config.vocab_size, step, &device);
        let (x, y) = (tokens.clone().narrow(1, 0, 16), tokens.narrow(1, 1, 16));

        let loss = cross_entropy(
            model.forward(Tensor::from_data(x.to_data(), &device)),
            Tensor::from_data(y.to_data(), &device),
        );
        let loss_value = loss.clone().into_scalar();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);

        let ref_loss = cross_entropy(
            reference.forward(Tensor::from_inner(x)),
            Tensor::from_inner(y),
        );
        let ref_value = ref_loss.clone().into_scalar();
        let grads = GradientsParams::from_grads(ref_loss.backward(), &reference);
        reference = ref_optim.step(1e-2, reference, grads);

        assert!(
            ((loss_value - ref_value) / ref_value).abs() <= 1e-5,
            "step {step}: {loss_value} vs {ref_value}"
        );
        let (_, on_device) = residency(&model);
        assert_eq!(
            on_device, 0,
            "step {step}: {on_device} parameters left on the device"
        );
        let stats = residency::stats();
        assert!(stats.resident_bytes <= 2 * block_bytes, "{stats:?}");
        assert!(
            stats.peak_resident_bytes <= 2 * block_bytes + largest,
            "{stats:?}"
        );
        assert!(stats.bytes_to_device > 0);
    }

    let (mut got, mut want) = (ReadParams(Vec::new()), ReadParams(Vec::new()));
    model.visit(&mut got);
    reference.visit(&mut want);
    for (i, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
        let err = data_rel_err(g, w);
        assert!(err <= 1e-5, "parameter {i}: relative error {err}");
    }
}
