//! `Offload<B>` as a drop-in backend: an unchanged burn model trained with
//! `Autodiff<Offload<B>>` + burn-optim matches `Autodiff<B>`, and its weights
//! live in host memory between steps; constants are made where they are read;
//! the page-in trace prefetches without changing a value. The residency and
//! prefetch counters are process-wide: the tests take turns ([`serial`]).

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::AdamWConfig;
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn_offload::residency::{self, set_param_cache_bytes};
use burn_offload::{prefetch, BlockModel, HostOptimizerConfig, HostParams};
use burn_offload_tests::{
    tiny_llama_pair, train_side_by_side, ReadParams, TestAutodiff as Reference, WriteParams,
};
use models::{Llama, LlamaConfig};
use std::sync::{Mutex, MutexGuard};

type Off = burn_offload_tests::OffloadAutodiff;

/// One test at a time in this binary (the counters are process-wide).
fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

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
    let _turn = serial();
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

/// `zeros`, `ones` and `full` (autodiff's backward makes them at activation
/// sizes) are filled on the device where an operation reads them: no host
/// values, no copy. (`Autodiff`'s own `full` goes through `from_data`.)
#[test]
fn constants_are_made_where_they_are_read() {
    type Plain = burn_offload::Offload<burn_offload_tests::TestBackend>;
    let _turn = serial();
    let device = Default::default();
    let before = residency::stats().bytes_to_device;
    let product = Tensor::<Off, 2>::ones([64, 128], &device) * Tensor::zeros([64, 128], &device);
    let sum = (product.inner() + Tensor::<Plain, 2>::full([64, 128], 2.0, &device))
        .sum()
        .into_scalar()
        .elem::<f32>();
    assert_eq!(sum, 2.0 * 64.0 * 128.0);
    assert_eq!(
        residency::stats().bytes_to_device,
        before,
        "constants copied"
    );
    // Their host values still exist when asked for.
    let ones = Tensor::<Off, 1>::ones([3], &device).into_data();
    assert_eq!(ones.to_vec::<f32>().unwrap(), vec![1.0; 3]);
}

/// The trace prefetch with a cache of two blocks' weights (copies started
/// ahead get evicted too): steps that follow the trace are replayed, a step
/// that reads in another order (an extra forward before it) is recorded as
/// the new trace, and training follows plain burn throughout.
#[test]
fn trace_prefetch_follows_changes_of_order_and_eviction() {
    let _turn = serial();
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let (model, reference) = tiny_llama_pair();
    let block_bytes = (model.blocks()[0].num_params() * 4) as u64;
    set_param_cache_bytes(2 * block_bytes);

    let mut recorded = None;
    let optim = HostOptimizerConfig::default().init::<Off, Llama<Off>>();
    let ref_optim = AdamWConfig::new().init::<Reference, Llama<Reference>>();
    let probe = burn_offload_tests::random_tokens::<Off>(1, 8, config.vocab_size, 99, &device);
    train_side_by_side(
        model,
        reference,
        optim,
        ref_optim,
        10,
        1e-2,
        |step, model| {
            // Step 0 recorded the trace (a trace left by another test or not).
            if step == 0 {
                recorded = Some(prefetch::stats());
            }
            // Read by steps 3 and 4 before their own forward.
            if step == 2 || step == 3 {
                drop(model.forward(probe.clone()));
            }
        },
    );
    let (before, after) = (recorded.expect("ten steps"), prefetch::stats());
    assert_eq!(after.steps - before.steps, 9, "{after:?}");
    // Steps 3 and 5 leave the trace; 1, 2, 4 and 6 to 9 follow it.
    assert_eq!(after.diverged - before.diverged, 2, "{after:?}");
    assert_eq!(after.replayed - before.replayed, 7, "{after:?}");
    assert!(after.copies > before.copies, "{after:?}");
}
