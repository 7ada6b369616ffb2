//! The `train` binary never loses work: checkpoint folders belong to one run,
//! every output path is checked before the first step, metrics keep their
//! history across resumes, and flags that would be ignored are refused.

use std::path::Path;
use std::process::Output;

mod common;
use common::{checkpoint_names, metrics};

/// Runs `train` on the tiny Llama with a short, fast configuration plus `args`.
fn train(args: &[&str]) -> Output {
    common::train(
        &[&["--model", "llama-tiny"][..], &common::FAST].concat(),
        args,
    )
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one `error:` line of a failed run.
fn error_line(args: &[&str]) -> String {
    let out = train(args);
    let err = stderr(&out);
    assert!(!out.status.success(), "expected failure for {args:?}");
    assert!(
        !err.contains("panicked"),
        "panic instead of an error:\n{err}"
    );
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "want one error line for {args:?}:\n{err}");
    errors[0].to_string()
}

fn assert_refused(args: &[&str], expected: &str) {
    let line = error_line(args);
    assert!(
        line.contains(expected),
        "for {args:?}: want `{expected}` in: {line}"
    );
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_fresh_run_refuses_a_folder_with_another_runs_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let ckx = dir.path().join("ckx");
    let first = train(&[
        "--steps",
        "6",
        "--checkpoint-dir",
        s(&ckx),
        "--checkpoint-every",
        "3",
        "--keep",
        "2",
    ]);
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(checkpoint_names(&ckx), ["step-00000003", "step-00000006"]);

    let line = error_line(&[
        "--steps",
        "4",
        "--seed",
        "7",
        "--checkpoint-dir",
        s(&ckx),
        "--checkpoint-every",
        "2",
        "--keep",
        "2",
    ]);
    assert!(line.contains("holds checkpoints of another run"), "{line}");
    assert!(
        line.contains(&format!("--resume {}", ckx.display())),
        "{line}"
    );
    assert_eq!(
        checkpoint_names(&ckx),
        ["step-00000003", "step-00000006"],
        "the refused run touched the folder"
    );
}

/// A run resumed from an earlier checkpoint writes lower step numbers than
/// the folder's newest: rotation goes by write order, and so does `--resume`.
#[test]
fn rotation_removes_the_runs_oldest_written_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let first = train(&[
        "--steps",
        "8",
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "2",
        "--keep",
        "10",
    ]);
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(checkpoint_names(&ck).len(), 4);

    let again = train(&[
        "--steps",
        "8",
        "--resume",
        s(&ck.join("step-00000002")),
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "1",
        "--keep",
        "2",
        "--stop-after",
        "4",
    ]);
    let out = stdout(&again);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(out.contains("checkpoint: "), "{out}");
    let last = out
        .lines()
        .find_map(|l| l.strip_prefix("checkpoint: "))
        .unwrap();
    assert!(
        Path::new(last).is_dir(),
        "the last checkpoint line names a removed folder: {last}"
    );
    assert_eq!(checkpoint_names(&ck), ["step-00000003", "step-00000004"]);
    assert_eq!(
        burn_offload::checkpoint::resolve(&ck).unwrap(),
        ck.join("step-00000004")
    );
}

#[test]
fn bad_output_paths_are_refused_before_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.jsonl");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a folder").unwrap();
    for (flag, path) in [("--checkpoint-dir", "/proc/x"), ("--export-hf", s(&file))] {
        let line = error_line(&["--steps", "3", "--metrics", s(&m), flag, path]);
        assert!(line.contains(flag), "{line}");
        assert_eq!(line.matches(path).count(), 1, "path once: {line}");
        assert!(
            line.matches("os error").count() <= 1,
            "OS message once: {line}"
        );
        assert!(metrics(&m).is_empty(), "{flag}: trained before failing");
    }
    let line = error_line(&["--steps", "3", "--metrics", "/proc/x/m.jsonl"]);
    assert!(line.contains("--metrics `/proc/x/m.jsonl`"), "{line}");
    assert_eq!(line.matches("os error").count(), 1, "{line}");
}

#[test]
fn a_resume_appends_to_the_metrics_and_a_failed_one_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, m) = (dir.path().join("ck"), dir.path().join("m.jsonl"));
    let base = [
        "--steps",
        "6",
        "--checkpoint-dir",
        s(&ck),
        "--metrics",
        s(&m),
    ];
    let first = train(&[&base[..], &["--stop-after", "3"]].concat());
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(metrics(&m).len(), 3);

    // A resume that fails (another model) leaves the file as it was.
    let before = std::fs::read(&m).unwrap();
    let failed = train(&[&base[..], &["--resume", s(&ck), "--model", "gpt2-tiny"]].concat());
    assert!(!failed.status.success());
    assert_eq!(std::fs::read(&m).unwrap(), before);

    let second = train(&[&base[..], &["--resume", s(&ck)]].concat());
    assert!(second.status.success(), "{}", stderr(&second));
    let lines = metrics(&m);
    assert_eq!(lines.len(), 3 + 1 + 3, "{lines:?}");
    let marker = &lines[3];
    assert_eq!(marker["step"], 3);
    assert!(
        marker["resumed_from"]
            .as_str()
            .unwrap()
            .ends_with("step-00000003"),
        "{marker}"
    );
    let steps: Vec<u64> = lines
        .iter()
        .filter(|l| l.get("loss").is_some())
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [0, 1, 2, 3, 4, 5]);
}

#[test]
fn flags_that_would_be_ignored_or_mislead_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ck = s(dir.path());
    let cases: [(&[&str], &str); 14] = [
        (
            &["--checkpoint-every", "2"],
            "--checkpoint-every needs --checkpoint-dir",
        ),
        (&["--keep", "5"], "--keep needs --checkpoint-dir"),
        (&["--stop-after", "0"], "--stop-after must be at least 1"),
        (
            &["--steps", "2", "--stop-after", "5"],
            "--stop-after 5 is beyond --steps 2",
        ),
        (&["--grad-clip", "nan"], "--grad-clip must be a number >= 0"),
        (&["--grad-clip=-1"], "--grad-clip must be a number >= 0"),
        (
            &["--keep", "0", "--checkpoint-dir", ck],
            "--keep must be at least 1",
        ),
        (
            &["--host-mem-gib", "nan"],
            "--host-mem-gib must be a positive number",
        ),
        (
            &["--host-mem-gib=-1"],
            "--host-mem-gib must be a positive number",
        ),
        (
            &["--gpu-mem-gib", "0"],
            "--gpu-mem-gib must be a positive number",
        ),
        (
            &["--resident", "--serial-copies"],
            "--serial-copies is an option of the offload engine",
        ),
        (
            &["--resident", "--max-skips", "3"],
            "--max-skips is an option of the offload engine",
        ),
        (
            &["--resident", "--stop-after", "1"],
            "--stop-after is an option of the offload engine",
        ),
        (
            &["--sample-tokens", "0", "--temperature", "0.7"],
            "--temperature has no effect with --sample-tokens 0",
        ),
    ];
    for (args, expected) in cases {
        assert_refused(&[&["--steps", "1"][..], args].concat(), expected);
    }
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "a refused run wrote into the checkpoint folder"
    );
}

#[test]
fn resuming_a_finished_run_says_there_is_nothing_left_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let args = ["--steps", "2", "--checkpoint-dir", s(&ck)];
    assert!(train(&args).status.success());
    let again = train(&[&args[..], &["--resume", s(&ck)]].concat());
    let out = stdout(&again);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(out.contains("nothing left to do"), "{out}");
    assert!(out.contains("step 2 of --steps 2"), "{out}");
    assert!(!out.contains("NaN"), "{out}");
}

#[test]
fn config_and_file_errors_say_the_os_or_parser_message_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.json");
    let line = error_line(&["--model", s(&missing)]);
    assert_eq!(
        line.matches("No such file or directory").count(),
        1,
        "{line}"
    );
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, b"{\"arch\": \"llama\", \"d_model\": 64,").unwrap();
    let line = error_line(&["--model", s(&bad)]);
    assert_eq!(line.matches("EOF while parsing").count(), 1, "{line}");
    let line = error_line(&["--init-from", s(dir.path())]);
    assert_eq!(
        line.matches("No such file or directory").count(),
        1,
        "{line}"
    );
}

#[test]
fn a_byte_order_mark_starts_a_jsonl_file_or_a_config_without_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("docs.jsonl");
    let mut bytes = "\u{feff}".as_bytes().to_vec();
    for i in 0..20 {
        bytes.extend(format!("{{\"text\": \"document number {i} with some words\"}}\n").bytes());
    }
    std::fs::write(&data, bytes).unwrap();
    let config = dir.path().join("model.json");
    let tiny =
        serde_json::to_string(&models::ModelConfig::Llama(models::LlamaConfig::tiny())).unwrap();
    std::fs::write(&config, format!("\u{feff}{tiny}")).unwrap();
    let out = train(&["--steps", "1", "--data", s(&data), "--model", s(&config)]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn the_eta_counts_only_the_steps_this_process_ran() {
    use std::time::Duration;
    use trainer::progress::eta;
    // Resumed at step 90 of 100; 2 steps in 10 s: 8 left take 40 s.
    assert_eq!(
        eta(90, 92, 100, Duration::from_secs(10)),
        Some(Duration::from_secs(40))
    );
    assert_eq!(eta(90, 90, 100, Duration::from_secs(10)), None);
}
