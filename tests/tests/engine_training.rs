//! The block-streamed engine's schedules and modes against plain burn
//! (burn-optim AdamW) and against each other: training trajectories,
//! clipping, kept graphs, deferred updates, device memory in depth.
//!
//! Relative error of a tensor: `‖engine − reference‖₂ / ‖reference‖₂` (normwise).

mod engine_common;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::{AdamWConfig as BurnAdamW, GradientsParams, Optimizer};
use burn::prelude::*;
use burn_offload::checkpoint::CheckpointDir;
use burn_offload::{BlockModel, Engine, EngineConfig};
use burn_offload_tests::{
    batch, lift, rel_err, values, TestAutodiff as AD, TestBackend as B, TOL, TRAJECTORY_TOL,
};
use engine_common::{engine_config, slot_count};
use models::{cross_entropy, LlamaConfig};

/// Multiplies every gradient by `scale` (global-norm clipping for the reference).
struct ScaleGrads<'a> {
    grads: &'a mut GradientsParams,
    scale: f32,
    sum_sq: f64,
}

impl ModuleMapper<AD> for ScaleGrads<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AD, D>>) -> Param<Tensor<AD, D>> {
        let g = self.grads.remove::<B, D>(param.id).unwrap();
        self.sum_sq += g.clone().square().sum().into_scalar() as f64;
        self.grads.register(param.id, g * self.scale);
        param
    }
}

fn global_norm(model: &models::Llama<AD>, grads: &mut GradientsParams) -> f64 {
    let mut m = ScaleGrads {
        grads,
        scale: 1.0,
        sum_sq: 0.0,
    };
    let _ = model.clone().map(&mut m);
    m.sum_sq.sqrt()
}

/// Runs `steps` of plain burn (reference) and of the engine from the same
/// initial weights and batches; compares losses, parameters and Adam moments.
fn check_training(fused: bool, clip: Option<f64>) {
    check_training_keeping(fused, clip, 0);
}

/// [`check_training`] with the last `kept_graphs` blocks not recomputed.
fn check_training_keeping(fused: bool, clip: Option<f64>, kept_graphs: usize) {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    // Seeded: the weights (and so the rounding the moments accumulate over
    // 20 steps) do not depend on which tests ran before in this process.
    B::seed(&device, 20);
    let mut model = config.init::<AD>(&device);
    let mut engine_cfg = engine_config(fused);
    engine_cfg.grad_clip = clip;
    engine_cfg.kept_graphs = kept_graphs;
    let mut engine = Engine::new(model.valid(), engine_cfg, &device).unwrap();
    let mut optim = BurnAdamW::new()
        .with_weight_decay(0.01)
        .init::<AD, models::Llama<AD>>();

    let steps = 20;
    for step in 0..steps {
        let lr = 3e-3 * (1.0 + (step as f64 * 0.3).cos()) / 2.0 + 1e-4;
        let data = batch(2, 16, config.vocab_size, 100 + step);
        let (x, y) = lift(&data);
        let loss = cross_entropy(model.forward(x), y);
        let want_loss = loss.clone().into_scalar();
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        if let Some(clip) = clip {
            let norm = global_norm(&model, &mut grads);
            let scale = if norm > clip {
                (clip / norm) as f32
            } else {
                1.0
            };
            let _ = model.clone().map(&mut ScaleGrads {
                grads: &mut grads,
                scale,
                sum_sq: 0.0,
            });
        }
        model = optim.step(lr, model, grads);

        let report = engine.step(&[data], lr).unwrap();
        let err = (report.loss - want_loss).abs() / want_loss;
        assert!(
            err <= TRAJECTORY_TOL,
            "step {step}: loss {} vs {want_loss}",
            report.loss
        );
    }
    assert_eq!(engine.updates(), steps);
    for (id, reference) in values::<AD, _>(&model, None) {
        let err = rel_err(engine.param(&id).unwrap(), &reference);
        assert!(
            err <= TRAJECTORY_TOL,
            "parameter {id} after {steps} steps: relative error {err}"
        );
    }
    // Optimizer state: Adam's first and second moments, parameter by parameter.
    let mut moments = Moments {
        record: optim.to_record(),
        engine: &mut engine,
        checked: 0,
    };
    model.visit(&mut moments);
    let checked = moments.checked;
    assert_eq!(checked, slot_count(engine.store()));
}

struct Moments<'a> {
    record: <burn::optim::adaptor::OptimizerAdaptor<burn::optim::AdamW, models::Llama<AD>, AD> as Optimizer<models::Llama<AD>, AD>>::Record,
    engine: &'a mut Engine<B, models::Llama<B>>,
    checked: usize,
}

impl ModuleVisitor<AD> for Moments<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AD, D>>) {
        let state = self
            .record
            .remove(&param.id)
            .unwrap()
            .into_state::<D>()
            .momentum;
        let (m, v) = self.engine.moments(&param.id).unwrap();
        let want_m = state.moment_1.into_data().to_vec::<f32>().unwrap();
        let want_v = state.moment_2.into_data().to_vec::<f32>().unwrap();
        let (em, ev) = (rel_err(&m, &want_m), rel_err(&v, &want_v));
        assert!(
            em <= TRAJECTORY_TOL && ev <= TRAJECTORY_TOL,
            "moments of {}: relative errors {em}, {ev}",
            param.id
        );
        self.checked += 1;
    }
}

#[test]
fn twenty_steps_match_plain_burn_adamw() {
    check_training(false, None);
}

#[test]
fn twenty_fused_steps_match_plain_burn_adamw() {
    check_training(true, None);
}

#[test]
fn global_norm_clipping_matches_reference_in_both_modes() {
    check_training(false, Some(0.5));
    check_training(true, Some(0.5));
}

/// Kept forward graphs across steps: deferred updates must not touch a
/// kept block's weights before its backward, and fused mode with clipping
/// runs forward and backward twice per step, each pass keeping its own graphs.
#[test]
fn kept_graphs_train_like_plain_burn_in_both_modes() {
    check_training_keeping(false, Some(0.5), 1);
    check_training_keeping(true, Some(0.5), 2);
}

#[test]
fn device_resident_parameters_are_flat_in_depth() {
    let device = Default::default();
    let peak = |layers: usize| {
        let config = LlamaConfig {
            n_layer: layers,
            ..LlamaConfig::tiny()
        };
        let mut engine =
            Engine::new(config.init::<B>(&device), engine_config(false), &device).unwrap();
        engine
            .step(&[batch(2, 8, config.vocab_size, 1)], 1e-3)
            .unwrap();
        engine
            .step(&[batch(2, 8, config.vocab_size, 2)], 1e-3)
            .unwrap();
        let block_bytes = engine.store().groups[1].param_bytes() as f64;
        (engine.pager_stats().peak_resident_bytes as f64, block_bytes)
    };
    let (shallow, block) = peak(4);
    let (deep, _) = peak(16);
    assert!(
        (deep - shallow).abs() <= 0.1 * shallow,
        "peak {shallow} B at 4 layers vs {deep} B at 16"
    );
    assert!(
        deep <= 3.0 * block,
        "peak {deep} B exceeds three blocks ({block} B each)"
    );
}

#[test]
fn engine_trains_a_model_initialised_on_offload_like_one_on_the_inner_backend() {
    use burn_offload::Offload;
    use burn_offload::StoreLayout;
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let host_model = config.init::<Offload<B>>(&device);
    // A second store with the same values, bound positionally into a model on B.
    let layout = StoreLayout::f32_gradients(true);
    let store =
        burn_offload::HostStore::from_modules(&host_model, host_model.blocks(), layout).unwrap();
    let mut on_b = Engine::with_store(
        config.init::<B>(&device),
        store,
        engine_config(false),
        &device,
    )
    .unwrap();
    let mut on_offload = Engine::new(host_model, engine_config(false), &device).unwrap();

    for step in 0..3 {
        let (x, y) = batch(2, 8, config.vocab_size, step);
        let off_batch = (
            Tensor::from_data(x.to_data(), &device),
            Tensor::from_data(y.to_data(), &device),
        );
        let want = on_b.step(&[(x, y)], 1e-2).unwrap();
        let got = on_offload.step(&[off_batch], 1e-2).unwrap();
        assert!(
            (got.loss - want.loss).abs() <= TOL * want.loss,
            "step {step}: {} vs {}",
            got.loss,
            want.loss
        );
    }
    for (g, (a, b)) in on_offload
        .store()
        .groups
        .iter()
        .zip(&on_b.store().groups)
        .enumerate()
    {
        let err = rel_err(a.params.as_slice(), b.params.as_slice());
        assert!(err <= TOL, "group {g}: relative error {err}");
    }
}

/// By default each group's update waits until the next step binds the group
/// (the CPU updates block i+2 while the device runs block i's forward). That
/// must not change a bit: the serialised engine updates at once after the
/// backward and is the reference. Reading one parameter between steps settles
/// only its group; a checkpoint-free sample (`last_logits`) settles the rest.
#[test]
fn deferred_updates_equal_immediate_ones_bit_for_bit() {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let model = config.init::<AD>(&device);
    let one_block_param = *values::<AD, _>(&model.blocks()[1], None)
        .keys()
        .next()
        .unwrap();
    let mut cfg = engine_config(false);
    cfg.grad_clip = Some(0.5);
    let model = model.valid();
    let mut deferred = Engine::new(model.clone(), cfg.clone(), &device).unwrap();
    // The same deferred updates with the optimizer not waiting for the
    // forward's weight copies (`hold_updates_for_copies: false`).
    let unheld_cfg = EngineConfig {
        hold_updates_for_copies: false,
        ..cfg.clone()
    };
    let mut unheld = Engine::new(model.clone(), unheld_cfg, &device).unwrap();
    cfg.overlap = false;
    let mut immediate = Engine::new(model, cfg, &device).unwrap();
    let groups = config.n_layer + 1;
    for step in 0..4u64 {
        let data = [batch(2, 8, config.vocab_size, 40 + step)];
        let a = deferred.step(&data, 1e-2).unwrap();
        let b = immediate.step(&data, 1e-2).unwrap();
        let c = unheld.step(&data, 1e-2).unwrap();
        assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "step {step}");
        assert_eq!(a.grad_norm.to_bits(), b.grad_norm.to_bits(), "step {step}");
        assert_eq!(c.loss.to_bits(), b.loss.to_bits(), "step {step}, unheld");
        assert_eq!(
            c.grad_norm.to_bits(),
            b.grad_norm.to_bits(),
            "step {step}, unheld"
        );
        assert_eq!(deferred.pending_groups(), groups, "step {step}");
        assert_eq!(immediate.pending_groups(), 0, "step {step}");
        if step == 1 {
            let got = deferred.param(&one_block_param).unwrap().to_vec();
            assert_eq!(deferred.pending_groups(), groups - 1);
            assert_eq!(got, immediate.param(&one_block_param).unwrap());
        }
    }
    let probe = batch(1, 4, config.vocab_size, 99).0;
    deferred.last_logits(&probe).unwrap();
    assert_eq!(
        deferred.pending_groups(),
        0,
        "the forward settles every group"
    );
    unheld.settle_all();
    let (a, b, c) = (
        deferred.into_store(),
        immediate.into_store(),
        unheld.into_store(),
    );
    for (g, (a, b)) in a.groups.iter().zip(&b.groups).enumerate() {
        assert!(
            c.groups[g].params.as_slice() == b.params.as_slice(),
            "group {g} params, unheld"
        );
        assert!(
            a.params.as_slice() == b.params.as_slice(),
            "group {g} params"
        );
        assert!(a.moments.bits_eq(&b.moments), "group {g} moments");
    }
}

/// Whatever reads the store whole (export, checkpoint, `store()`) sees every
/// deferred update applied.
#[test]
fn readers_of_the_store_settle_deferred_updates() {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    let model = config.init::<AD>(&device).valid();
    let mut engine = Engine::new(model, engine_config(false), &device).unwrap();
    let before = engine.store().groups[2].params.as_slice().to_vec();
    let stem_before = engine.store().groups[0].params.as_slice().to_vec();
    engine
        .step(&[batch(2, 8, config.vocab_size, 5)], 1e-2)
        .unwrap();
    assert!(engine.pending_groups() > 0);
    let dir = tempfile::tempdir().unwrap();
    engine
        .save_checkpoint(
            &mut CheckpointDir::open(dir.path(), "test", 1).unwrap(),
            serde_json::Value::Null,
        )
        .unwrap();
    assert_eq!(engine.pending_groups(), 0);
    assert_ne!(engine.store().groups[2].params.as_slice(), &before[..]);
    // The stem's deferred update too: every slot (table and head) moved.
    let stem = &engine.store().groups[0];
    for slot in &stem.slots {
        let range = slot.offset..slot.offset + slot.len;
        assert_ne!(
            &stem.params.as_slice()[range.clone()],
            &stem_before[range],
            "stem slot {} not updated",
            slot.name
        );
    }
}
