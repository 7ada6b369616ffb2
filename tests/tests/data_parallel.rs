//! Data parallel training: an engine on N devices (N lanes, each on its own
//! micro-batch) against one device on the same micro-batches as one batch.
//! On the CPU the lanes are logical devices and their gradients meet through
//! burn's ops, the stand-in for NCCL; the schedule and the reduction order
//! are the GPU run's.
//!
//! Relative error of a tensor: `‖lanes − one device‖₂ / ‖one device‖₂`.

use burn::module::{AutodiffModule, HasAutodiffModule};
use burn_offload::checkpoint::CheckpointDir;
use burn_offload::{
    AdamWConfig, BatchError, BlockModel, ConfigError, DecoderBlock, Engine, EngineConfig,
    EngineError, OptimizerConfig,
};
use burn_offload_tests::{
    batch, lane_devices, rel_err, Batch, TestAutodiff as AD, TestBackend as B, TOL, TRAJECTORY_TOL,
};
use models::{Gpt2Config, LlamaConfig};

fn config(fused: bool, clip: Option<f64>) -> EngineConfig {
    EngineConfig {
        optimizer: OptimizerConfig::AdamW(AdamWConfig {
            weight_decay: 0.01,
            ..Default::default()
        }),
        grad_clip: clip,
        fused,
        // Small chunks so the chunked head really splits the sequence.
        loss_chunk_tokens: 8,
        // The waiting path of the backward's bound runs too.
        gradient_blocks_in_flight: 1,
        ..Default::default()
    }
}

/// `rows` rows of `whole` from row `rows * i`, on `device` (through host
/// memory: burn's `to_device` between GPUs needs cubecl's communicators).
fn part(whole: &Batch, i: usize, rows: usize, device: &burn::tensor::Device<B>) -> Batch {
    let rows_of = |t: &burn::tensor::Tensor<B, 2, burn::tensor::Int>| {
        burn::tensor::Tensor::from_data(t.clone().narrow(0, rows * i, rows).into_data(), device)
    };
    (rows_of(&whole.0), rows_of(&whole.1))
}

trait Trained:
    BlockModel<B, Block: HasAutodiffModule<AD, TrainModule: DecoderBlock<AD>>>
    + HasAutodiffModule<AD, TrainModule: BlockModel<AD>>
{
}

impl<M> Trained for M where
    M: BlockModel<B, Block: HasAutodiffModule<AD, TrainModule: DecoderBlock<AD>>>
        + HasAutodiffModule<AD, TrainModule: BlockModel<AD>>
{
}

#[test]
fn lanes_on_micro_batches_accumulate_what_one_device_does_on_their_concatenation() {
    let device = Default::default();
    // GPT-2 differentiates its embeddings on the device; Llama's lookup
    // gradient is formed on the host, each lane's rows added in turn.
    let gpt2 = Gpt2Config::tiny();
    let llama = LlamaConfig::tiny();
    for lanes in [2, 3] {
        for rounds in [1, 2] {
            check_gradients(
                gpt2.init::<AD>(&device).valid(),
                gpt2.vocab_size,
                lanes,
                rounds,
            );
            check_gradients(
                llama.init::<AD>(&device).valid(),
                llama.vocab_size,
                lanes,
                rounds,
            );
        }
    }
}

/// `lanes` devices, `rounds` micro-batches each, against one device on
/// all of them as one batch.
fn check_gradients<M: Trained>(model: M, vocab: usize, lanes: usize, rounds: usize) {
    let device = Default::default();
    let devices = lane_devices(lanes);
    let n = lanes * rounds;
    let whole = batch(2 * n, 12, vocab, 3);
    let mut one = Engine::new(model.clone(), config(false, None), &device).unwrap();
    let loss_one = one
        .accumulate_gradients(std::slice::from_ref(&whole))
        .unwrap();
    // The lanes also keep their blocks' attention outputs for the
    // recompute: each lane's, per block and round, must reach its own.
    let keeping = EngineConfig {
        kept_attention: usize::MAX,
        ..config(false, None)
    };
    let mut spread = Engine::on_devices(model.clone(), keeping, &devices).unwrap();
    // A first accumulation on other data: the next one must replace it.
    let other: Vec<Batch> = (0..lanes)
        .map(|i| part(&batch(2 * lanes, 12, vocab, 7), i, 2, &devices[i]))
        .collect();
    spread.accumulate_gradients(&other).unwrap();
    let micro: Vec<Batch> = (0..n)
        .map(|i| part(&whole, i, 2, &devices[i % lanes]))
        .collect();
    let loss_spread = spread.accumulate_gradients(&micro).unwrap();
    assert!(
        (loss_one - loss_spread).abs() / loss_one <= TOL,
        "{lanes} lanes × {rounds}: loss {loss_spread} vs {loss_one}"
    );
    for id in &burn::module::list_param_ids(&model) {
        let err = rel_err(&spread.grad(id).unwrap(), &one.grad(id).unwrap());
        assert!(
            err <= TOL,
            "{lanes} lanes × {rounds}: gradient of {id}: relative error {err}"
        );
    }
}

#[test]
fn twenty_steps_on_two_and_three_devices_equal_one_device_with_clipping() {
    for fused in [false, true] {
        for lanes in [2, 3] {
            check_training(fused, lanes);
        }
    }
}

/// 20 steps with clipping (which binds: the tiny Llama's norm is well above
/// 0.5) on `lanes` devices, one micro-batch each, against one device on
/// their concatenation: losses, clipping factors and parameters.
fn check_training(fused: bool, lanes: usize) {
    let device = Default::default();
    let devices = lane_devices(lanes);
    let llama = LlamaConfig::tiny();
    let model = llama.init::<AD>(&device).valid();
    let cfg = config(fused, Some(0.5));
    let mut one = Engine::new(model.clone(), cfg.clone(), &device).unwrap();
    let mut spread = Engine::on_devices(model.clone(), cfg, &devices).unwrap();
    let mut clipped = 0;
    for step in 0..20 {
        let lr = 3e-3 * (1.0 + (step as f64 * 0.3).cos()) / 2.0 + 1e-4;
        let whole = batch(2 * lanes, 16, llama.vocab_size, 100 + step);
        let micro: Vec<Batch> = (0..lanes)
            .map(|i| part(&whole, i, 2, &devices[i]))
            .collect();
        let want = one.step(&[whole], lr).unwrap();
        let got = spread.step(&micro, lr).unwrap();
        let err = (got.loss - want.loss).abs() / want.loss;
        assert!(
            err <= TRAJECTORY_TOL,
            "fused {fused}, {lanes} lanes, step {step}: loss {} vs {}",
            got.loss,
            want.loss
        );
        let err = ((got.clip_scale - want.clip_scale) / want.clip_scale).abs();
        assert!(
            err <= TRAJECTORY_TOL as f64,
            "fused {fused}, {lanes} lanes, step {step}: clip scale {} vs {}",
            got.clip_scale,
            want.clip_scale
        );
        clipped += usize::from(want.clip_scale < 1.0);
    }
    assert!(clipped > 0, "clipping never bound");
    for id in &burn::module::list_param_ids(&model) {
        let err = rel_err(spread.param(id).unwrap(), one.param(id).unwrap());
        assert!(
            err <= TRAJECTORY_TOL,
            "fused {fused}, {lanes} lanes: parameter {id} after 20 steps: relative error {err}"
        );
    }
}

#[test]
fn resume_on_two_devices_is_bit_exact() {
    for fused in [false, true] {
        resume_is_bit_exact(fused);
    }
}

/// Ten steps on two devices against five, a checkpoint, a fresh engine
/// loading it and five more: losses and parameters to the bit.
fn resume_is_bit_exact(fused: bool) {
    let device = Default::default();
    let devices = lane_devices(2);
    let llama = LlamaConfig::tiny();
    let model = llama.init::<AD>(&device).valid();
    let cfg = config(fused, Some(0.5));
    let data = |step: u64| -> Vec<Batch> {
        let whole = batch(4, 16, llama.vocab_size, 200 + step);
        (0..2).map(|i| part(&whole, i, 2, &devices[i])).collect()
    };
    let run = |engine: &mut Engine<B, models::Llama<B>>, steps: std::ops::Range<u64>| {
        steps
            .map(|step| engine.step(&data(step), 1e-3).unwrap().loss.to_bits())
            .collect::<Vec<_>>()
    };
    let mut straight = Engine::on_devices(model.clone(), cfg.clone(), &devices).unwrap();
    let want = run(&mut straight, 0..10);

    let tmp = tempfile::tempdir().unwrap();
    let mut first = Engine::on_devices(model.clone(), cfg.clone(), &devices).unwrap();
    let mut losses = run(&mut first, 0..5);
    let mut dir = CheckpointDir::open(tmp.path(), "lanes", 2).unwrap();
    let saved = first
        .save_checkpoint(&mut dir, serde_json::Value::Null)
        .unwrap();
    drop(first);
    let mut resumed = Engine::on_devices(model.clone(), cfg, &devices).unwrap();
    resumed.load_checkpoint(&saved).unwrap();
    losses.extend(run(&mut resumed, 5..10));
    assert_eq!(losses, want, "fused {fused}: losses differ after resume");
    for id in &burn::module::list_param_ids(&model) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(resumed.param(id).unwrap()) == bits(straight.param(id).unwrap()),
            "fused {fused}: parameter {id} differs after resume"
        );
    }
}

#[test]
fn micro_batches_the_devices_cannot_share_are_refused() {
    let device = Default::default();
    let devices = lane_devices(2);
    let llama = LlamaConfig::tiny();
    let model = llama.init::<AD>(&device).valid();
    let three: Vec<Batch> = (0..3).map(|i| batch(2, 8, llama.vocab_size, i)).collect();
    let mut engine = Engine::on_devices(model.clone(), config(false, None), &devices).unwrap();
    let err = engine.step(&three, 1e-3).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Batch(BatchError::Lanes {
                micro_batches: 3,
                lanes: 2
            })
        ),
        "{err}"
    );
    // Fused mode takes one micro-batch per device, no more.
    let mut fused = Engine::on_devices(model.clone(), config(true, None), &devices).unwrap();
    let err = fused.step(&three[..2], 1e-3).map(|_| ()).and_then(|_| {
        let four: Vec<Batch> = (0..4).map(|i| batch(2, 8, llama.vocab_size, i)).collect();
        fused.step(&four, 1e-3).map(|_| ())
    });
    assert!(
        matches!(
            err,
            Err(EngineError::Config(ConfigError::FusedAccumulation))
        ),
        "{err:?}"
    );
    let none: Result<Engine<B, models::Llama<B>>, _> =
        Engine::on_devices(model, config(false, None), &[]);
    assert!(matches!(
        none,
        Err(EngineError::Config(ConfigError::NoDevices))
    ));
}
