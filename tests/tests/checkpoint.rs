//! Checkpoints: bit-exact resume, non-finite steps, and every bad checkpoint
//! a clear error that leaves the saved checkpoint as it was.

use std::path::{Path, PathBuf};

use trainer::options::TrainOptions;
use trainer::plan::OptimState;
use trainer::run::run;

fn opts(dir: &Path) -> TrainOptions {
    TrainOptions {
        model: "llama-tiny".into(),
        steps: 10,
        batch: 2,
        seq_len: 16,
        lr: Some(3e-3),
        warmup: 3,
        sample_tokens: 4,
        checkpoint_dir: Some(dir.to_path_buf()),
        ..TrainOptions::default()
    }
}

fn newest(dir: &Path) -> PathBuf {
    burn_offload::checkpoint::resolve(dir).unwrap()
}

#[test]
fn ten_steps_equal_five_then_resume_five_bit_for_bit() {
    resume_is_bit_exact(OptimState::Fp32, 1);
}

/// The same with 8-bit optimizer state: its codes and scales resume as saved.
#[test]
fn eight_bit_state_resumes_bit_for_bit() {
    resume_is_bit_exact(OptimState::EightBit, 1);
}

/// The same on two devices (logical ones on the CPU), data parallel.
#[test]
fn a_run_on_two_devices_resumes_bit_for_bit() {
    resume_is_bit_exact(OptimState::Fp32, 2);
}

#[test]
fn a_checkpoint_resumes_only_on_as_many_devices() {
    let dir = tempfile::tempdir().unwrap();
    run(&TrainOptions {
        steps: 2,
        gpus: 2,
        ..opts(dir.path())
    })
    .unwrap();
    let err = run(&TrainOptions {
        steps: 4,
        resume: Some(dir.path().into()),
        ..opts(dir.path())
    })
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("--batch/--seq-len/--accum/--gpus"), "{msg}");
}

fn resume_is_bit_exact(optim_state: OptimState, gpus: usize) {
    let opts = |dir: &Path| TrainOptions {
        optim_state,
        gpus,
        ..opts(dir)
    };
    let (straight, split) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let all = run(&opts(straight.path())).unwrap();
    assert_eq!(all.losses.len(), 10);

    let first = run(&TrainOptions {
        stop_after: Some(5),
        ..opts(split.path())
    })
    .unwrap();
    assert_eq!(first.losses.len(), 5);
    let second = run(&TrainOptions {
        resume: Some(split.path().into()),
        ..opts(split.path())
    })
    .unwrap();
    assert_eq!(second.start_step, 5);

    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let resumed: Vec<f32> = first.losses.iter().chain(&second.losses).copied().collect();
    assert_eq!(
        bits(&resumed),
        bits(&all.losses),
        "losses differ:\n{resumed:?}\n{:?}",
        all.losses
    );
    // Final parameters and Adam state are identical byte for byte.
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let a = std::fs::read(newest(straight.path()).join(file)).unwrap();
        let b = std::fs::read(newest(split.path()).join(file)).unwrap();
        assert!(a == b, "{file} differs after resume");
    }
}

#[test]
fn consecutive_non_finite_steps_stop_the_run_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let err = run(&TrainOptions {
        poison_at_step: Some(3),
        max_skips: 4,
        steps: 20,
        metrics: Some(metrics.clone()),
        checkpoint_dir: None,
        ..opts(dir.path())
    })
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("4 consecutive steps had a non-finite loss"),
        "{msg}"
    );
    assert!(msg.contains("parameters are as after step 3"), "{msg}");
}

/// Saves a 3-step checkpoint, damages it with `damage`, and checks that
/// resuming fails with `expected` and leaves the files as they were.
fn resume_fails(damage: impl FnOnce(&Path), model: &str, expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    run(&TrainOptions {
        steps: 3,
        ..opts(dir.path())
    })
    .unwrap();
    let checkpoint = newest(dir.path());
    damage(&checkpoint);
    let snapshot = |p: &Path| {
        let mut files: Vec<_> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
            .into_iter()
            .map(|f| std::fs::read(f).unwrap())
            .collect::<Vec<_>>()
    };
    let before = snapshot(&checkpoint);
    let err = run(&TrainOptions {
        model: model.into(),
        steps: 6,
        resume: Some(dir.path().into()),
        ..opts(dir.path())
    })
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains(expected), "want `{expected}` in: {msg}");
    assert_eq!(msg.lines().count(), 1, "one-line error: {msg}");
    assert!(
        snapshot(&checkpoint) == before,
        "a failed resume changed the checkpoint"
    );
    assert_eq!(
        burn_offload::checkpoint::list(dir.path()).unwrap().len(),
        1,
        "a failed resume wrote a checkpoint"
    );
}

#[test]
fn checkpoint_of_another_model_shape_is_refused() {
    resume_fails(|_| {}, "gpt2-tiny", "is for model");
}

#[test]
fn truncated_safetensors_is_refused() {
    resume_fails(
        |c| {
            let path = c.join("model.safetensors");
            let bytes = std::fs::read(&path).unwrap();
            std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        },
        "llama-tiny",
        "model.safetensors` is truncated or corrupted",
    );
}

#[test]
fn corrupted_safetensors_is_refused() {
    resume_fails(
        |c| {
            let path = c.join("optimizer.safetensors");
            let mut bytes = std::fs::read(&path).unwrap();
            let last = bytes.len() - 3;
            bytes[last] ^= 0x40;
            std::fs::write(&path, bytes).unwrap();
        },
        "llama-tiny",
        "optimizer.safetensors` is truncated or corrupted: checksum",
    );
}

#[test]
fn manifest_of_another_version_is_refused() {
    resume_fails(
        |c| {
            let path = c.join("manifest.json");
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(
                &path,
                text.replace("\"format_version\": 1", "\"format_version\": 99"),
            )
            .unwrap();
        },
        "llama-tiny",
        "has format version 99, this build reads version 1",
    );
}

#[test]
fn malformed_manifest_is_refused() {
    resume_fails(
        |c| std::fs::write(c.join("manifest.json"), "{ not json").unwrap(),
        "llama-tiny",
        "is not a valid checkpoint manifest",
    );
}

#[test]
fn too_little_host_memory_is_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let err = run(&TrainOptions {
        host_mem_gib: Some(1e-4),
        metrics: Some(metrics.clone()),
        ..opts(&dir.path().join("ckpt"))
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("not enough host memory"), "{err}");
    // Less than the runtime and the OS's headroom: no model setting helps.
    assert!(
        err.contains("16 B/param") && err.contains("the runtime and the OS's headroom alone take"),
        "{err}"
    );
    assert!(
        !metrics.exists() && !dir.path().join("ckpt").exists(),
        "files created before the refusal"
    );
}

/// A checkpoint with 8-bit optimizer state resumes only as 8-bit (and fp32
/// only as fp32): one line naming the state, the checkpoint unchanged.
#[test]
fn checkpoint_of_the_other_optimizer_state_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    run(&TrainOptions {
        steps: 2,
        optim_state: OptimState::EightBit,
        ..opts(dir.path())
    })
    .unwrap();
    let checkpoint = newest(dir.path());
    let before = std::fs::read(checkpoint.join("optimizer.safetensors")).unwrap();
    let err = run(&TrainOptions {
        steps: 4,
        resume: Some(dir.path().into()),
        ..opts(dir.path())
    })
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("8-bit optimizer state"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "one-line error: {msg}");
    let after = std::fs::read(checkpoint.join("optimizer.safetensors")).unwrap();
    assert!(before == after, "a failed resume changed the checkpoint");
}
