//! Compute precision: the engine in bf16 against f32 (plain burn and the
//! engine itself). Master weights and Adam state stay f32 on the host.
//!
//! Tolerances (stated for the issue): one step's gradients in bf16 are within
//! a normwise relative error of `GRAD_TOL` of plain burn's f32 gradients; over
//! 50 AdamW steps the bf16 loss stays within `CURVE_TOL` (relative) of the
//! f32 engine's loss at every step.

use burn::module::AutodiffModule;
use burn_offload::checkpoint::CheckpointDir;
use burn_offload::{BlockModel, Compute, Engine, EngineConfig};
use burn_offload_tests::{
    batch, lift, rel_err, values, Batch, TestAutodiff as AD, TestBackend as B,
};
use models::{cross_entropy, Gpt2Config, LlamaConfig};

/// bf16 keeps 8 significant bits (relative rounding 2⁻⁹ ≈ 2e-3 per value);
/// through a few matmuls and norms the gradients of the tiny models move by
/// about 1e-2 (measured); this leaves room without hiding an f32 run.
const GRAD_TOL: f64 = 5e-2;
/// The bf16 engine must differ from f32 by more than this, or it did not run in bf16.
const MIN_BF16_ERR: f64 = 1e-4;
/// Loss curves: relative distance per step between bf16 and f32 training,
/// and its mean over the 50 steps. Measured on the CPU (random weights each
/// run, loss ≈ 5.5 → 3.2 at lr 1e-3): worst 6e-4 to 5.2e-3, mean 1.5e-4 to
/// 4.5e-4 over 22 runs with random targets; worst 6.9e-4 to 2.1e-3, mean
/// ≤ 3.5e-4 over 7 runs with next-token targets (the shared `batch`). At lr 3e-3 the loss falls to 0.85 and the curves part
/// in time where it drops fastest (worst up to 4e-2), which measures the
/// memorisation's chaos more than the precision.
const CURVE_TOL: f32 = 1.5e-2;
const MEAN_CURVE_TOL: f32 = 3e-3;
const CURVE_LR: f64 = 1e-3;

fn config(compute: Compute) -> EngineConfig {
    EngineConfig {
        compute,
        grad_clip: Some(1.0),
        loss_chunk_tokens: 8,
        ..Default::default()
    }
}

fn check_gradients<M>(model: M, vocab: usize)
where
    M: BlockModel<AD> + AutodiffModule<AD>,
    M::InnerModule: BlockModel<B> + burn::module::HasAutodiffModule<AD, TrainModule = M>,
    <M::InnerModule as BlockModel<B>>::Block: burn::module::HasAutodiffModule<AD>,
    <<M::InnerModule as BlockModel<B>>::Block as burn::module::HasAutodiffModule<AD>>::TrainModule:
        burn_offload::DecoderBlock<AD>,
{
    let data = batch(2, 16, vocab, 7);
    let (x, y) = lift(&data);
    let grads = cross_entropy(model.forward(x), y).backward();
    let want = values::<AD, _>(&model, Some(&grads));

    let device = Default::default();
    // Every block recomputed, the last one's bf16 forward graph kept, and
    // the compact host layout (weights cast on the device, bf16 gradients).
    for (kept_graphs, compact) in [(0, false), (1, false), (0, true)] {
        let config = EngineConfig {
            kept_graphs,
            cast_on_device: compact,
            compute_precision_gradients: compact,
            ..config(Compute::Bf16)
        };
        let mut engine = Engine::new(model.valid(), config, &device).unwrap();
        engine
            .accumulate_gradients(std::slice::from_ref(&data))
            .unwrap();
        // One normwise error over all gradients, parameters in a fixed order.
        let (mut got, mut reference) = (Vec::new(), Vec::new());
        for (id, w) in &want {
            got.extend_from_slice(&engine.grad(id).expect("engine has every parameter"));
            reference.extend_from_slice(w);
        }
        let err = f64::from(rel_err(&got, &reference));
        eprintln!(
            "bf16 gradients ({kept_graphs} kept graphs) vs plain burn f32: normwise relative error {err:.2e}"
        );
        assert!(
            (MIN_BF16_ERR..=GRAD_TOL).contains(&err),
            "bf16 gradients ({kept_graphs} kept graphs) vs f32: normwise relative error {err:.2e}, want within [{MIN_BF16_ERR:.0e}, {GRAD_TOL:.0e}]"
        );
    }
}

#[test]
fn bf16_gradients_are_close_to_plain_burn_f32_llama() {
    let config = LlamaConfig::tiny();
    check_gradients(config.init::<AD>(&Default::default()), config.vocab_size);
}

#[test]
fn bf16_gradients_are_close_to_plain_burn_f32_gpt2() {
    let config = Gpt2Config::tiny();
    check_gradients(config.init::<AD>(&Default::default()), config.vocab_size);
}

/// Trains the same initial weights 50 steps in f32 and in bf16 (a few batches
/// cycled, so the loss falls well below its start: ≈ 5.5 → 3.2), comparing the losses at
/// every step. Master weights must keep f32 precision: a bf16 round trip
/// would leave the low 16 bits of every weight zero.
#[test]
fn bf16_loss_curve_tracks_fp32_for_50_steps() {
    let device = Default::default();
    let model_config = LlamaConfig::tiny();
    let model = model_config.init::<AD>(&device).valid();
    let batches: Vec<Batch> = (0..4)
        .map(|i| batch(4, 16, model_config.vocab_size, 100 + i))
        .collect();
    let mut fp32 = Engine::new(model.clone(), config(Compute::Fp32), &device).unwrap();
    let mut bf16 = Engine::new(model, config(Compute::Bf16), &device).unwrap();
    let (mut first, mut last, mut worst, mut sum) = (0.0, 0.0, 0.0f32, 0.0f32);
    for step in 0..50 {
        let data = [batches[step % batches.len()].clone()];
        let a = fp32.step(&data, CURVE_LR).unwrap();
        let b = bf16.step(&data, CURVE_LR).unwrap();
        assert!(!a.skipped && !b.skipped, "step {step} was skipped");
        let err = (b.loss - a.loss).abs() / a.loss;
        worst = worst.max(err);
        sum += err;
        assert!(
            err <= CURVE_TOL,
            "step {step}: bf16 loss {} vs f32 {} (relative {err:.2e})",
            b.loss,
            a.loss
        );
        if step == 0 {
            first = a.loss;
        }
        last = a.loss;
    }
    assert!(last < 0.7 * first, "the loss should fall: {first} → {last}");
    let mean = sum / 50.0;
    eprintln!(
        "bf16 vs f32 over 50 steps: relative loss distance worst {worst:.2e}, mean {mean:.2e}"
    );
    assert!(
        mean <= MEAN_CURVE_TOL,
        "mean relative loss distance {mean:.2e}"
    );
    let store = bf16.into_store();
    let (mut wide, mut total) = (0usize, 0usize);
    for group in &store.groups {
        for &w in group.params.as_slice() {
            total += 1;
            wide += usize::from(w.to_bits() & 0xffff != 0);
        }
    }
    assert!(
        wide as f64 > 0.9 * total as f64,
        "only {wide} of {total} master weights carry more than bf16 precision"
    );
}

/// The compact host layout in bf16 (the weights cast on the device instead
/// of a bf16 copy on the host, the blocks' gradients kept in bf16 as they
/// arrive) against the default layout, with clipping, over 20 steps:
/// deferred (the host worker), inline with a kept graph, and fused.
///
/// Gradients kept in bf16 change no bit: every loss and gradient norm, and
/// the weights and moments after, are equal. The cast on the device gives
/// the host's bf16 weights but for exact ties: burn-flex casts through f64
/// (`half`'s `bf16::from_f64`, which rounds 530 in 10⁷ random f32 the other
/// way than `from_f32`; CUDA's cast and `from_f32` both round to nearest
/// even). From the same weights (the first step) the loss and norm then
/// agree within `TIE_TOL`; once updated, bf16 training amplifies the
/// difference (AdamW normalises each gradient), so later steps' losses are
/// held to `STEP_TOL`. Measured over five CPU runs (random weights each):
/// first-step loss or norm at most 2.3e-4 apart, later losses at most 6.5e-4.
///
/// It saves 2 host bytes per block parameter.
#[test]
fn bf16_compact_host_layout_matches_the_default_layout() {
    const TIE_TOL: f64 = 1e-3;
    const STEP_TOL: f64 = 3e-3;
    let device = Default::default();
    let model_config = LlamaConfig::tiny();
    // Seeded: how far the cast's ties carry over 20 bf16 steps depends on the
    // weights (about one draw in eight went past `STEP_TOL` unseeded).
    <B as burn::tensor::backend::Backend>::seed(&device, 36);
    let model = model_config.init::<AD>(&device).valid();
    let modes = [(true, false, 0), (false, false, 1), (true, true, 0)];
    let layouts = [(false, true), (true, false), (true, true)];
    let (mut worst_first, mut worst_curve) = (0.0f64, 0.0f64);
    for (overlap, fused, kept_graphs) in modes {
        for (cast_on_device, compute_precision_gradients) in layouts {
            if fused && compute_precision_gradients {
                continue; // fused mode keeps no gradient buffer
            }
            let base = EngineConfig {
                overlap,
                fused,
                kept_graphs,
                ..config(Compute::Bf16)
            };
            let compact = EngineConfig {
                cast_on_device,
                compute_precision_gradients,
                ..base.clone()
            };
            let case = format!(
                "cast {cast_on_device}, bf16 gradients {compute_precision_gradients}, overlap {overlap}, fused {fused}, {kept_graphs} kept"
            );
            let mut want = Engine::new(model.clone(), base, &device).unwrap();
            let mut got = Engine::new(model.clone(), compact, &device).unwrap();
            for step in 0..20 {
                let data = [batch(2, 16, model_config.vocab_size, 400 + step)];
                let (a, b) = (
                    want.step(&data, 3e-3).unwrap(),
                    got.step(&data, 3e-3).unwrap(),
                );
                assert!(!a.skipped && !b.skipped, "{case}, step {step}: skipped");
                assert!(a.clip_scale < 1.0 || step > 0, "{case}: clipping must act");
                let (loss, norm) = (f64::from(b.loss), b.grad_norm);
                let (want_loss, want_norm) = (f64::from(a.loss), a.grad_norm);
                if !cast_on_device {
                    assert_eq!(
                        loss.to_bits(),
                        want_loss.to_bits(),
                        "{case}, step {step}: loss"
                    );
                    assert_eq!(
                        norm.to_bits(),
                        want_norm.to_bits(),
                        "{case}, step {step}: norm"
                    );
                    continue;
                }
                let rel = |x: f64, y: f64| (x - y).abs() / y.abs();
                if step == 0 {
                    let first = rel(loss, want_loss).max(rel(norm, want_norm));
                    worst_first = worst_first.max(first);
                    assert!(
                        first <= TIE_TOL,
                        "{case}: loss {loss} vs {want_loss}, norm {norm} vs {want_norm}"
                    );
                } else {
                    worst_curve = worst_curve.max(rel(loss, want_loss));
                    assert!(
                        rel(loss, want_loss) <= STEP_TOL,
                        "{case}, step {step}: loss {loss} vs {want_loss}"
                    );
                }
            }
            let (want_store, got_store) = (want.store(), got.store());
            if !cast_on_device {
                for (g, (w, x)) in want_store.groups.iter().zip(&got_store.groups).enumerate() {
                    assert!(
                        w.params.as_slice() == x.params.as_slice() && w.moments.bits_eq(&x.moments),
                        "{case}: group {g} differs after the steps"
                    );
                }
            }
            let blocks: usize = got_store.groups[1..].iter().map(|g| g.numel()).sum();
            let saved = want_store.host_bytes() - got_store.host_bytes();
            let want_saved = if compute_precision_gradients {
                2 * blocks
            } else {
                0
            };
            assert_eq!(saved, want_saved, "{case}: host bytes saved");
        }
    }
    eprintln!(
        "cast on the device: first step {worst_first:.1e} apart, later losses {worst_curve:.1e}"
    );
}

/// The compact layout's settings are refused where they cannot apply, before
/// anything changes: at f32, fused (no buffer), and over several micro-batches.
#[test]
fn compact_layout_settings_are_refused_where_they_cannot_apply() {
    use burn_offload::{ConfigError, EngineError};
    let device = Default::default();
    let model_config = LlamaConfig::tiny();
    let model = model_config.init::<AD>(&device).valid();
    let refused = |config: EngineConfig| match Engine::new(model.clone(), config, &device) {
        Err(EngineError::Config(e)) => e,
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("accepted"),
    };
    for config in [
        EngineConfig {
            cast_on_device: true,
            ..config(Compute::Fp32)
        },
        EngineConfig {
            compute_precision_gradients: true,
            ..config(Compute::Fp32)
        },
    ] {
        assert!(matches!(refused(config), ConfigError::NeedsLowPrecision(_)));
    }
    let fused = EngineConfig {
        fused: true,
        compute_precision_gradients: true,
        ..config(Compute::Bf16)
    };
    assert_eq!(refused(fused), ConfigError::FusedGradients);

    let compact = EngineConfig {
        compute_precision_gradients: true,
        ..config(Compute::Bf16)
    };
    let mut engine = Engine::new(model, compact, &device).unwrap();
    let before = engine.store().groups[1].params.as_slice().to_vec();
    let two = [
        batch(1, 8, model_config.vocab_size, 1),
        batch(1, 8, model_config.vocab_size, 2),
    ];
    let err = engine.step(&two, 1e-2).unwrap_err();
    assert!(
        matches!(err, EngineError::Config(ConfigError::CompactAccumulation)),
        "{err}"
    );
    assert_eq!(engine.updates(), 0);
    assert!(engine.store().groups[1].params.as_slice() == before.as_slice());
}

/// Fused mode in bf16: the first step's loss (same weights, same forward) is
/// the non-fused one's, and the updates stay close.
#[test]
fn bf16_fused_mode_matches_bf16_with_a_gradient_buffer() {
    let device = Default::default();
    let model_config = LlamaConfig::tiny();
    let model = model_config.init::<AD>(&device).valid();
    let fused_config = EngineConfig {
        fused: true,
        ..config(Compute::Bf16)
    };
    let mut fused = Engine::new(model.clone(), fused_config, &device).unwrap();
    let mut buffered = Engine::new(model, config(Compute::Bf16), &device).unwrap();
    for step in 0..3 {
        let data = [batch(2, 16, model_config.vocab_size, 300 + step)];
        let a = fused.step(&data, 1e-3).unwrap();
        let b = buffered.step(&data, 1e-3).unwrap();
        let err = (a.loss - b.loss).abs() / b.loss;
        assert!(err <= 1e-3, "step {step}: fused {} vs {}", a.loss, b.loss);
        assert!(
            (a.grad_norm - b.grad_norm).abs() <= 1e-3 * b.grad_norm,
            "step {step}: norms {} vs {}",
            a.grad_norm,
            b.grad_norm
        );
    }
}

/// The bf16 weights the device sees follow every write to the f32 master
/// weights: updates, surgery through `store_mut`, and checkpoint loads.
#[test]
fn bf16_weights_follow_surgery_and_checkpoint_loads() {
    let device = Default::default();
    let model_config = LlamaConfig::tiny();
    let model = model_config.init::<AD>(&device).valid();
    let probe = batch(1, 8, model_config.vocab_size, 7).0;
    let logits = |e: &mut Engine<B, models::Llama<B>>| {
        e.last_logits(&probe)
            .unwrap()
            .into_data()
            .to_vec::<f32>()
            .unwrap()
    };
    let mut engine = Engine::new(model.clone(), config(Compute::Bf16), &device).unwrap();
    let before = logits(&mut engine);
    for group in &mut engine.store_mut().groups[1..] {
        group
            .params
            .as_mut_slice()
            .iter_mut()
            .for_each(|w| *w *= 0.5);
    }
    let after = logits(&mut engine);
    assert_ne!(before, after, "surgery did not reach the device");
    let mut fresh = Engine::new(engine.model(), config(Compute::Bf16), &device).unwrap();
    assert_eq!(
        after,
        logits(&mut fresh),
        "stale bf16 weights after surgery"
    );

    // A checkpoint of `fresh` after a step, loaded into `engine`.
    fresh
        .step(&[batch(2, 8, model_config.vocab_size, 8)], 1e-2)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = fresh
        .save_checkpoint(
            &mut CheckpointDir::open(dir.path(), "test", 1).unwrap(),
            serde_json::Value::Null,
        )
        .unwrap();
    engine.load_checkpoint(&path).unwrap();
    assert_eq!(
        logits(&mut fresh),
        logits(&mut engine),
        "stale bf16 weights after a checkpoint load"
    );
}
