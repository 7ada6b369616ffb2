//! The `train` process under signals: `kill -9` at any moment (a checkpoint
//! write included) leaves the newest checkpoint loadable and a resume that
//! continues the same losses; SIGINT and SIGTERM save one and exit promptly;
//! a second signal exits at once; a locked folder refuses a second run.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

const BASE: [&str; 8] = [
    "--model",
    "llama-tiny",
    "--batch",
    "1",
    "--seq-len",
    "8",
    "--sample-tokens",
    "1",
];

fn spawn(extra: &[&str], pause_ms: Option<u64>) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_train"));
    cmd.args(BASE)
        .args(["--steps", "100000"])
        .args(extra)
        .stdout(Stdio::piped())
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
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for `child` to exit, killing it (and failing) after `timeout`.
fn exits_within(child: &mut Child, timeout: Duration) -> (ExitStatus, String, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = String::new();
            let mut err = String::new();
            use std::io::Read;
            child.stdout.take().unwrap().read_to_string(&mut out).ok();
            child.stderr.take().unwrap().read_to_string(&mut err).ok();
            return (status, out, err);
        }
        if start.elapsed() > timeout {
            child.kill().ok();
            child.wait().ok();
            panic!("train did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
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

fn has_checkpoint(dir: &Path) -> bool {
    names(dir).iter().any(|n| n.starts_with("step-"))
}

fn metric_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Loads a checkpoint into an engine for the same model, as a resume would;
/// returns the steps it holds.
fn loads(checkpoint: &Path) -> u64 {
    let device = Default::default();
    let model = models::LlamaConfig::tiny().init::<burn::backend::Flex>(&device);
    let mut engine = burn_offload::Engine::new(model, Default::default(), &device).unwrap();
    let manifest = engine.load_checkpoint(checkpoint).unwrap();
    assert!(manifest.updates >= 1);
    manifest.updates
}

/// Loss of each step in a metrics file (the last line of a step wins).
fn losses(path: &Path) -> std::collections::BTreeMap<u64, f64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l.get("loss").is_some())
        .map(|l| (l["step"].as_u64().unwrap(), l["loss"].as_f64().unwrap()))
        .collect()
}

#[test]
fn kill_9_at_random_times_resumes_to_the_losses_of_an_uninterrupted_run() {
    const STEPS: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let (ck, m, reference) = (
        dir.path().join("ck"),
        dir.path().join("m.jsonl"),
        dir.path().join("ref.jsonl"),
    );
    let steps = STEPS.to_string();
    let straight = Command::new(env!("CARGO_BIN_EXE_train"))
        .args(BASE)
        .args(["--steps", &steps, "--metrics", reference.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(straight.status.success());
    let want = losses(&reference);
    assert_eq!(want.len(), STEPS);

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill times drawn with seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let args = [
        "--steps",
        &steps,
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--checkpoint-every",
        "1",
        "--keep",
        "2",
        "--metrics",
        m.to_str().unwrap(),
    ];
    let resume = ["--resume", ck.to_str().unwrap()];
    // Four kills: the first in the middle of a checkpoint write, the others
    // at a random moment after the process has saved something of its own.
    for kill in 0..4 {
        let extra = if kill == 0 {
            args.to_vec()
        } else {
            [&args[..], &resume[..]].concat()
        };
        let saved_before = names(&ck);
        let pause = if kill == 0 {
            400
        } else {
            rng.random_range(20..80)
        };
        let mut child = spawn(&extra, Some(pause));
        wait_for(
            "a checkpoint of this process",
            Duration::from_secs(120),
            || {
                names(&ck)
                    .iter()
                    .any(|n| n.starts_with("step-") && !saved_before.contains(n))
            },
        );
        if kill == 0 {
            wait_for("the next write", Duration::from_secs(60), || {
                names(&ck).iter().any(|n| n.starts_with(".tmp-step-"))
            });
        } else {
            std::thread::sleep(Duration::from_millis(rng.random_range(0..400)));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        if kill == 0 {
            assert!(
                names(&ck).iter().any(|n| n.starts_with(".tmp-step-")),
                "killed mid-write: the temporary must remain"
            );
        }
        let newest = burn_offload::checkpoint::resolve(&ck).unwrap();
        let step = loads(&newest);
        // Every step up to the checkpoint has its metrics line on disk.
        let logged = losses(&m);
        assert!(
            (0..step).all(|s| logged.contains_key(&s)),
            "kill {kill}: metrics lack steps before {step}: {logged:?}"
        );
        if step as usize == STEPS {
            break;
        }
    }
    let mut last = Command::new(env!("CARGO_BIN_EXE_train"));
    last.args(BASE).args(args).args(resume);
    let out = last.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = losses(&m);
    assert_eq!(got.len(), STEPS, "steps missing from the metrics: {got:?}");
    for (step, loss) in &want {
        assert_eq!(
            got[step].to_bits(),
            loss.to_bits(),
            "step {step}: resumed loss {} differs from {loss} (seed {seed})",
            got[step]
        );
    }
}

/// A long run with its metrics in a temporary folder (and its checkpoints,
/// with `checkpoints`), once it has logged `steps` steps. Bind `_dir`: the
/// folder lives as long as it.
struct Started {
    child: Child,
    ckpt: std::path::PathBuf,
    metrics: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn started(extra: &[&str], checkpoints: bool, pause_ms: Option<u64>, steps: usize) -> Started {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, metrics) = (dir.path().join("ckpt"), dir.path().join("m.jsonl"));
    let mut args = vec!["--metrics", metrics.to_str().unwrap()];
    if checkpoints {
        args.extend(["--checkpoint-dir", ckpt.to_str().unwrap()]);
    }
    args.extend(extra);
    let child = spawn(&args, pause_ms);
    wait_for("the first steps", Duration::from_secs(120), || {
        metric_lines(&metrics) >= steps
    });
    Started {
        child,
        ckpt,
        metrics,
        _dir: dir,
    }
}

#[test]
fn ctrl_c_saves_a_checkpoint_and_exits_promptly_without_a_sample() {
    // Generating these would take minutes: an interrupted run must not.
    let Started {
        mut child,
        ckpt,
        _dir,
        ..
    } = started(&["--sample-tokens", "200000"], true, None, 2);
    signal(&child, "INT");
    let (status, out, err) = exits_within(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted (SIGINT): checkpoint saved to"),
        "{err}"
    );
    assert!(!out.contains("--- sample ---"), "{out}");
    loads(&burn_offload::checkpoint::resolve(&ckpt).unwrap());
}

#[test]
fn sigterm_saves_a_checkpoint_and_exits_143() {
    let Started {
        mut child,
        ckpt,
        metrics,
        _dir,
    } = started(&[], true, None, 2);
    signal(&child, "TERM");
    let (status, _, err) = exits_within(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(143), "{err}");
    assert!(
        err.contains("interrupted (SIGTERM): checkpoint saved to"),
        "{err}"
    );
    let steps = loads(&burn_offload::checkpoint::resolve(&ckpt).unwrap());
    assert!(
        steps as usize >= metric_lines(&metrics),
        "steps run after the save"
    );
}

#[test]
fn a_second_signal_exits_at_once_saying_what_was_not_saved() {
    // The checkpoint written on the first signal takes a minute.
    let Started {
        mut child,
        ckpt,
        _dir,
        ..
    } = started(&[], true, Some(60_000), 2);
    signal(&child, "INT");
    wait_for("the checkpoint write", Duration::from_secs(60), || {
        names(&ckpt).iter().any(|n| n.starts_with(".tmp-step-"))
    });
    signal(&child, "TERM");
    let (status, _, err) = exits_within(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(143), "{err}");
    assert!(err.contains("SIGTERM again: exiting now"), "{err}");
    assert!(err.contains("no checkpoint was saved"), "{err}");
    assert!(!has_checkpoint(&ckpt));
}

#[test]
fn ctrl_c_without_a_checkpoint_folder_says_nothing_was_saved() {
    let Started {
        mut child, _dir, ..
    } = started(&[], false, None, 1);
    signal(&child, "INT");
    let (status, _, err) = exits_within(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(130));
    assert!(
        err.contains("nothing saved (no --checkpoint-dir given)"),
        "{err}"
    );
}

#[test]
fn a_second_run_cannot_write_into_a_folder_in_use() {
    let Started {
        child: mut first,
        ckpt,
        _dir,
        ..
    } = started(&[], true, None, 1);
    let ck = ckpt.to_str().unwrap();
    let second = Command::new(env!("CARGO_BIN_EXE_train"))
        .args(BASE)
        .args(["--steps", "2", "--checkpoint-dir", ck])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(!second.status.success());
    assert!(
        err.contains(&format!("is in use by another run (pid {})", first.id())),
        "{err}"
    );
}
