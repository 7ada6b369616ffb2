//! `Offload<B>` as a drop-in backend: an unchanged burn model trained with
//! `Autodiff<Offload<B>>` + burn-optim matches `Autodiff<B>`, and its weights
//! live in host memory between steps. One test: the residency counters are
//! process-wide.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::AdamWConfig;
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn_offload::residency::{self, set_param_cache_bytes};
use burn_offload::{BlockModel, HostParams};
use burn_offload_tests::{train_side_by_side, ReadParams, TestAutodiff as Reference, WriteParams};
use models::{Llama, LlamaConfig};

type Off = burn_offload_tests::OffloadAutodiff;

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
    let model = config.init::<Off>(&device);
    let mut values = ReadParams(Vec::new());
    model.visit(&mut values);
    let (host, on_device) = residency(&model);
    assert_eq!(
        on_device, 0,
        "{on_device} parameters initialised on the device"
    );
    assert_eq!(host, values.0.len());

    // The reference starts from the same weights.
    let reference = config
        .init::<Reference>(&device)
        .map(&mut WriteParams(values.0.into_iter()));

    // A cache of about two blocks' weights bounds what stays on the device.
    let block_bytes = (model.blocks()[0].num_params() * 4) as u64;
    set_param_cache_bytes(2 * block_bytes);
    let largest = (config.vocab_size * config.d_model * 4) as u64;

    let optim = HostParams(
        AdamWConfig::new()
            .with_weight_decay(0.01)
            .init::<Off, Llama<Off>>(),
    );
    let ref_optim = AdamWConfig::new()
        .with_weight_decay(0.01)
        .init::<Reference, Llama<Reference>>();
    train_side_by_side(
        model,
        reference,
        optim,
        ref_optim,
        5,
        1e-2,
        |step, model| {
            let (_, on_device) = residency(model);
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
        },
    );
}
