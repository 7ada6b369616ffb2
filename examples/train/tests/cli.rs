//! The `train` binary on bad input: a clear one-line error and a non-zero exit.

use std::path::Path;

mod common;

/// Runs `train` with a tiny, fast configuration plus `args`; returns (success, stderr).
fn train(args: &[&str]) -> (bool, String) {
    let out = common::train(&[&["--steps", "1"][..], &common::FAST].concat(), args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_fails_with(args: &[&str], expected: &str) {
    let (ok, stderr) = train(args);
    assert!(!ok, "expected failure for {args:?}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    assert!(
        line.contains(expected),
        "for {args:?}: want `{expected}` in error line, stderr was:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "panic instead of an error:\n{stderr}"
    );
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

#[test]
fn default_run_succeeds_and_writes_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("m.jsonl");
    let (ok, stderr) = train(&["--steps", "2", "--metrics", metrics.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for key in [
        "step",
        "loss",
        "lr",
        "tokens_per_s",
        "rss_bytes",
        "bytes_to_device",
        "peak_device_param_bytes",
    ] {
        assert!(
            lines[1].get(key).is_some(),
            "metrics line lacks `{key}`: {}",
            lines[1]
        );
    }
    assert!(lines[1]["peak_device_param_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn fused_and_resident_modes_run() {
    for mode in [&["--fused"][..], &["--resident"], &["--accum", "2"]] {
        let (ok, stderr) = train(&[&["--steps", "2"][..], mode].concat());
        assert!(ok, "{mode:?}: {stderr}");
    }
}

#[test]
fn missing_data_path() {
    assert_fails_with(&["--data", "/nonexistent/corpus.txt"], "does not exist");
}

#[test]
fn empty_data_file_and_directory() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write(dir.path(), "empty.txt", b"");
    assert_fails_with(&["--data", &empty], "is empty");
    let empty_dir = dir.path().join("nothing");
    std::fs::create_dir(&empty_dir).unwrap();
    assert_fails_with(
        &["--data", empty_dir.to_str().unwrap()],
        "contains no .txt, .jsonl or .parquet files",
    );
}

#[test]
fn non_utf8_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "binary.txt",
        &[0x66, 0x6f, 0xff, 0xfe, 0x00, 0x80],
    );
    assert_fails_with(&["--data", &path], "is not UTF-8");
}

#[test]
fn jsonl_without_text_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "docs.jsonl",
        b"{\"text\": \"fine\"}\n{\"body\": \"no text here\"}\n",
    );
    assert_fails_with(&["--data", &path], "line 2");
}

#[test]
fn seq_len_longer_than_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "short.txt", b"just a few words");
    assert_fails_with(&["--data", &path, "--seq-len", "64"], "window needs");
}

#[test]
fn too_little_host_memory() {
    assert_fails_with(&["--host-mem-gib", "0.0001"], "not enough host memory");
}

#[test]
fn resume_from_a_missing_checkpoint() {
    assert_fails_with(
        &["--resume", "/nonexistent/ckpt"],
        "no checkpoint in `/nonexistent/ckpt`",
    );
}

#[test]
fn unknown_preset() {
    assert_fails_with(&["--model", "gpt-5"], "unknown model preset `gpt-5`");
}

#[test]
fn malformed_config_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "model.json",
        b"{\"arch\": \"llama\", \"d_model\": 64,",
    );
    assert_fails_with(&["--model", &path], "malformed model config");
    let missing = dir.path().join("absent.json");
    assert_fails_with(
        &["--model", missing.to_str().unwrap()],
        "cannot read model config",
    );
}

#[test]
fn invalid_numbers() {
    assert_fails_with(&["--lr=-1"], "--lr must be a positive number");
    assert_fails_with(&["--batch", "0"], "--batch must be at least 1");
    assert_fails_with(
        &["--seq-len", "100000"],
        "exceeds the model's context length",
    );
}

/// Mistral's sliding window (8 positions in the fixture) limits what each
/// position sees, not the sequence: 40 tokens train; the context (64) still
/// bounds it.
#[test]
fn a_sequence_longer_than_the_sliding_window_trains() {
    let mistral = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/families/mistral"
    );
    let (ok, stderr) = train(&["--init-from", mistral, "--seq-len", "40"]);
    assert!(ok, "{stderr}");
    assert_fails_with(
        &["--init-from", mistral, "--seq-len", "65"],
        "--seq-len 65 exceeds the model's context length 64",
    );
}

/// `--host-layout compact` runs where it applies (bf16: 14 B/param with one
/// micro-batch, 16 with several, 12 fused) and is refused, naming why, where
/// it cannot.
#[test]
fn compact_host_layout_runs_and_is_refused_where_it_cannot_apply() {
    for (extra, mode) in [
        (
            &[][..],
            "buffered, host layout compact, fp32 Adam state: 14 B/param",
        ),
        (
            &["--accum", "2"],
            "buffered, host layout compact, fp32 Adam state: 16 B/param",
        ),
        (
            &["--fused"],
            "fused, host layout compact, fp32 Adam state: 12 B/param",
        ),
    ] {
        let args = [
            &[
                "--steps",
                "2",
                "--compute",
                "bf16",
                "--host-layout",
                "compact",
            ][..],
            extra,
        ]
        .concat();
        let (ok, stderr) = train(&args);
        assert!(ok, "{extra:?}: {stderr}");
        assert!(stderr.contains(mode), "{extra:?}: {stderr}");
    }
    assert_fails_with(
        &["--host-layout", "compact"],
        "compute precision below fp32",
    );
    assert_fails_with(&["--host-layout", "compact", "--resident"], "--resident");
    assert_fails_with(
        &["--host-layout", "tight"],
        "expected auto, full or compact",
    );
}

/// `--optim-state 8bit` trains with 8-bit moments (about 6 B/param in the
/// store with fused mode), and is an option of the engine only.
#[test]
fn eight_bit_optimizer_state_runs_and_is_refused_with_resident() {
    let (ok, stderr) = train(&["--steps", "2", "--optim-state", "8bit", "--fused"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("8bit Adam state: 6 B/param"), "{stderr}");
    assert_fails_with(&["--optim-state", "8bit", "--resident"], "--resident");
    assert_fails_with(&["--optim-state", "4bit"], "expected fp32 or 8bit");
}

/// `--param-cache-gib` sizes the type parameter's page cache: it runs with
/// `--resident --host-params` and is refused elsewhere and when not positive.
#[test]
fn param_cache_runs_with_host_params_and_is_refused_elsewhere() {
    let (ok, stderr) = train(&[
        "--steps",
        "2",
        "--resident",
        "--host-params",
        "--param-cache-gib",
        "0.5",
    ]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("parameter cache: 0.50 GiB"), "{stderr}");
    assert_fails_with(&["--param-cache-gib", "1"], "--host-params");
    assert_fails_with(&["--param-cache-gib", "1", "--resident"], "--host-params");
    assert_fails_with(
        &["--resident", "--host-params", "--param-cache-gib", "0"],
        "positive",
    );
}

/// `--block-recompute` chooses how the type parameter runs its blocks:
/// checkpoints recomputed in the backward, or one graph (`auto` on a CPU);
/// refused without `--resident --host-params`.
#[test]
fn block_recompute_runs_with_host_params_and_is_refused_elsewhere() {
    for (choice, said) in [
        ("on", "blocks run as checkpoints"),
        ("off", "blocks in one graph"),
        ("auto", "blocks in one graph"),
    ] {
        let (ok, stderr) = train(&[
            "--steps",
            "2",
            "--resident",
            "--host-params",
            "--block-recompute",
            choice,
        ]);
        assert!(ok, "{stderr}");
        assert!(
            stderr.contains(said),
            "--block-recompute {choice}: {stderr}"
        );
    }
    assert_fails_with(&["--block-recompute", "on"], "--host-params");
    assert_fails_with(&["--block-recompute", "on", "--resident"], "--host-params");
    let unknown = [
        "--resident",
        "--host-params",
        "--block-recompute",
        "sometimes",
    ];
    assert_fails_with(&unknown, "invalid value 'sometimes' for '--block-recompute");
    let (_, stderr) = train(&unknown);
    assert!(
        stderr.contains("[possible values: auto, on, off]"),
        "{stderr}"
    );
}

/// `--attention` chooses between CUDA's attention kernels; a CPU build has
/// neither, so asking for one is refused rather than ignored, and an unknown
/// name lists the choices.
#[test]
fn attention_kernels_are_refused_where_they_would_be_ignored() {
    if cfg!(feature = "cuda") {
        return;
    }
    assert_fails_with(
        &["--attention", "cubecl"],
        "--attention chooses CUDA's attention kernels, and this build runs on the CPU",
    );
    let (ok, stderr) = train(&["--attention", "flash"]);
    assert!(
        !ok && stderr.contains("auto") && stderr.contains("cubecl"),
        "{stderr}"
    );
}
