//! End-to-end: the `tiny` models learn a small repetitive corpus.

use burn_offload::Compute;
use trainer::options::TrainOptions;
use trainer::run::run;

/// A corpus a tiny model can nearly memorise: one sentence pattern repeated.
fn repetitive_corpus(dir: &std::path::Path) -> std::path::PathBuf {
    let text = "the cat sat on the mat. the dog sat on the log. ".repeat(200);
    let path = dir.join("corpus.txt");
    std::fs::write(&path, text).unwrap();
    path
}

fn train_tiny(model: &str, resident: bool) -> Vec<f32> {
    train_tiny_in(model, resident, Compute::Fp32)
}

fn train_tiny_in(model: &str, resident: bool, compute: Compute) -> Vec<f32> {
    let dir = tempfile::tempdir().unwrap();
    let opts = TrainOptions {
        model: model.into(),
        steps: 120,
        batch: 8,
        seq_len: 32,
        lr: Some(1e-2),
        warmup: 10,
        data: Some(repetitive_corpus(dir.path())),
        sample_tokens: 16,
        resident,
        compute,
        ..TrainOptions::default()
    };
    run(&opts).unwrap().losses
}

/// Byte-level loss starts near ln(256) = 5.55; the pattern has ~1 bit of
/// uncertainty per sentence, so a model that learned it is far below 0.5.
const LOSS_THRESHOLD: f32 = 0.5;

fn assert_learned(losses: &[f32]) {
    assert!(
        losses[0] > 4.5,
        "initial loss {} should be near ln(256)",
        losses[0]
    );
    let tail = &losses[losses.len() - 10..];
    let final_loss = tail.iter().sum::<f32>() / tail.len() as f32;
    assert!(
        final_loss < LOSS_THRESHOLD,
        "final loss {final_loss} (curve start {:?})",
        &losses[..5]
    );
}

#[test]
fn tiny_gpt2_learns_a_repetitive_corpus() {
    assert_learned(&train_tiny("gpt2-tiny", false));
}

#[test]
fn tiny_llama_learns_a_repetitive_corpus() {
    assert_learned(&train_tiny("llama-tiny", false));
}

#[test]
fn tiny_llama_learns_with_plain_burn_too() {
    assert_learned(&train_tiny("llama-tiny", true));
}

/// `--compute bf16`: the engine (bf16 on the device, f32 on the host) and the
/// resident baseline (f32 parameters cast for each forward) both learn.
#[test]
fn tiny_llama_learns_in_bf16_with_the_engine_and_plain_burn() {
    assert_learned(&train_tiny_in("llama-tiny", false, Compute::Bf16));
    assert_learned(&train_tiny_in("llama-tiny", true, Compute::Bf16));
}

/// `--resident --accum 2` over batches of 4 takes the same steps as one batch
/// of 8: the batcher draws the same sequences, and the micro-batch losses are
/// scaled so their gradients sum to the full batch's mean.
#[test]
fn resident_accumulation_matches_one_large_batch() {
    let dir = tempfile::tempdir().unwrap();
    let data = Some(repetitive_corpus(dir.path()));
    let losses = |batch, accum| {
        let opts = TrainOptions {
            model: "llama-tiny".into(),
            steps: 6,
            batch,
            accum,
            seq_len: 32,
            lr: Some(1e-2),
            warmup: 2,
            data: data.clone(),
            sample_tokens: 0,
            resident: true,
            ..TrainOptions::default()
        };
        run(&opts).unwrap().losses
    };
    let (whole, split) = (losses(8, 1), losses(4, 2));
    assert_eq!(whole.len(), 6);
    for (step, (a, b)) in whole.iter().zip(&split).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(1.0),
            "step {step}: batch 8 loss {a}, 2 x 4 accumulated {b} ({whole:?} vs {split:?})"
        );
    }
    // The loss moved, so the steps compared are real updates.
    assert!(whole[5] < whole[0] - 0.1, "{whole:?}");
}

/// `train --gpus 2` over batches of 4 takes the same steps as one device on
/// batches of 8 (the batcher draws the same sequences, one micro-batch per
/// device); `--gpus` with `--resident` is refused.
#[test]
fn two_devices_train_like_one_on_their_batches_together() {
    let dir = tempfile::tempdir().unwrap();
    let data = Some(repetitive_corpus(dir.path()));
    let opts = |batch, gpus| TrainOptions {
        model: "llama-tiny".into(),
        steps: 6,
        batch,
        gpus,
        seq_len: 32,
        lr: Some(1e-2),
        warmup: 2,
        data: data.clone(),
        sample_tokens: 0,
        ..TrainOptions::default()
    };
    let (whole, split) = (
        run(&opts(8, 1)).unwrap().losses,
        run(&opts(4, 2)).unwrap().losses,
    );
    assert_eq!(whole.len(), 6);
    for (step, (a, b)) in whole.iter().zip(&split).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(1.0),
            "step {step}: batch 8 loss {a}, 2 devices x 4 {b} ({whole:?} vs {split:?})"
        );
    }
    assert!(whole[5] < whole[0] - 0.1, "{whole:?}");
    let err = run(&TrainOptions {
        resident: true,
        ..opts(4, 2)
    })
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("--gpus is an option of the offload engine"),
        "{err:#}"
    );
}

/// The type parameter's path in the trainer (`--resident --host-params`):
/// the model on `Offload<B>` (drawn by its host generator, so from other
/// weights than plain burn's) with the host AdamW learns the corpus as
/// plain burn does; the flag without `--resident` is refused.
#[test]
fn host_params_learn_like_plain_burn() {
    let dir = tempfile::tempdir().unwrap();
    let opts = |host_params| TrainOptions {
        model: "llama-tiny".into(),
        steps: 60,
        batch: 8,
        seq_len: 32,
        lr: Some(1e-2),
        warmup: 10,
        data: Some(repetitive_corpus(dir.path())),
        sample_tokens: 0,
        resident: true,
        host_params,
        ..TrainOptions::default()
    };
    let tail = |losses: &[f32]| losses[losses.len() - 10..].iter().sum::<f32>() / 10.0;
    let plain = tail(&run(&opts(false)).unwrap().losses);
    let host = run(&opts(true)).unwrap().losses;
    assert!(host[0] > 4.5, "initial loss {}", host[0]);
    assert!(
        tail(&host) < 2.0 && tail(&host) < 1.5 * plain.max(0.5),
        "host parameters ended at {}, plain burn at {plain}",
        tail(&host)
    );
    let refused = run(&TrainOptions {
        resident: false,
        ..opts(true)
    })
    .unwrap_err();
    assert!(
        format!("{refused:#}").contains("--host-params"),
        "{refused:#}"
    );
}
