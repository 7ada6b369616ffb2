//! The `train` process under signals: `kill -9` in the middle of a checkpoint
//! write leaves the previous checkpoint loadable; Ctrl-C saves one and exits.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn spawn(extra: &[&str], pause_ms: Option<u64>) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_train"));
    cmd.args([
        "--model",
        "llama-tiny",
        "--steps",
        "100000",
        "--batch",
        "1",
        "--seq-len",
        "8",
        "--sample-tokens",
        "1",
    ])
    .args(extra)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if let Some(ms) = pause_ms {
        cmd.env("BURN_OFFLOAD_CHECKPOINT_PAUSE_MS", ms.to_string());
    }
    cmd.spawn().expect("train starts")
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Loads a checkpoint into an engine for the same model, as a resume would.
fn loads(checkpoint: &Path) {
    let device = Default::default();
    let model = models::LlamaConfig::tiny().init::<burn::backend::Flex>(&device);
    let mut engine = burn_offload::Engine::new(model, Default::default(), &device).unwrap();
    let manifest = engine.load_checkpoint(checkpoint).unwrap();
    assert!(manifest.updates >= 1);
}

#[test]
fn kill_9_during_a_checkpoint_write_leaves_the_previous_one_loadable() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let ckpt_arg = ckpt.to_str().unwrap();
    // Every step checkpoints; each write pauses half-way (between the two files).
    let mut child = spawn(
        &[
            "--checkpoint-dir",
            ckpt_arg,
            "--checkpoint-every",
            "1",
            "--keep",
            "10",
        ],
        Some(400),
    );
    wait_for("a complete checkpoint", Duration::from_secs(120), || {
        names(&ckpt).iter().any(|n| n.starts_with("step-"))
    });
    wait_for("the next write to start", Duration::from_secs(60), || {
        names(&ckpt).iter().any(|n| n.starts_with(".tmp-step-"))
    });
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    assert!(
        names(&ckpt).iter().any(|n| n.starts_with(".tmp-step-")),
        "killed mid-write: the temporary must remain"
    );
    let newest = burn_offload::checkpoint::resolve(&ckpt).unwrap();
    assert!(newest
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("step-"));
    loads(&newest);
}

#[test]
fn ctrl_c_saves_a_checkpoint_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let metrics = dir.path().join("m.jsonl");
    let args = [
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--metrics",
        metrics.to_str().unwrap(),
    ];
    let child = spawn(&args, None);
    wait_for("a first step", Duration::from_secs(120), || {
        std::fs::read_to_string(&metrics)
            .map(|t| t.lines().count() >= 2)
            .unwrap_or(false)
    });
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted: checkpoint saved to"),
        "{stderr}"
    );
    loads(&burn_offload::checkpoint::resolve(&ckpt).unwrap());
}

#[test]
fn ctrl_c_without_a_checkpoint_folder_says_nothing_was_saved() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("m.jsonl");
    let child = spawn(&["--metrics", metrics.to_str().unwrap()], None);
    wait_for("a first step", Duration::from_secs(120), || {
        std::fs::read_to_string(&metrics)
            .map(|t| t.lines().count() >= 1)
            .unwrap_or(false)
    });
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing saved (no --checkpoint-dir given)")
    );
}
