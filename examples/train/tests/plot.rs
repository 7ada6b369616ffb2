//! `plot` and the plot `train` writes beside its metrics: a PNG of the
//! asked size with the runs overlaid (evaluation lines and resume markers
//! read), and one `error:` line for a bad input or output.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{error_lines, train};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn plot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plot"))
        .args(args)
        .output()
        .expect("plot runs")
}

/// A PNG's width and height, from its signature and IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

/// A short run's metrics (with evaluations) and the PNG `train` wrote
/// beside them.
fn run(dir: &Path, name: &str, seed: &str) -> (PathBuf, Output) {
    let metrics = dir.join(format!("{name}.jsonl"));
    let out = train(
        &[
            "--steps",
            "4",
            "--batch",
            "2",
            "--seq-len",
            "16",
            "--sample-tokens",
            "0",
            "--eval-split",
            "0.1",
            "--eval-every",
            "2",
            "--seed",
            seed,
        ],
        &["--metrics", s(&metrics)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (metrics, out)
}

/// `train --metrics` ends with its curves beside the file; `plot` overlays
/// two runs (one with a resume marker) into the PNG `-o` names.
#[test]
fn train_writes_its_plot_and_plot_overlays_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (first, out) = run(dir.path(), "first", "1");
    let png = dir.path().join("first.png");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("plot: {}", s(&png))),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(png_size(&png), (1400, 1000));
    let (second, _) = run(dir.path(), "second", "2");
    let mut text = std::fs::read_to_string(&second).unwrap();
    text.insert_str(0, "{\"resumed_from\": \"ck/step-00000002\", \"step\": 2}\n");
    std::fs::write(&second, text).unwrap();
    let both = dir.path().join("both.png");
    let out = plot(&[s(&first), s(&second), "-o", s(&both)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(png_size(&both), (1400, 1000));
    assert_ne!(std::fs::read(&both).unwrap(), std::fs::read(&png).unwrap());
}

/// A missing, empty or broken metrics file, and an output that cannot be
/// written: one `error:` line, a failure, no PNG.
#[test]
fn bad_metrics_or_outputs_are_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jsonl");
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let broken = dir.path().join("broken.jsonl");
    std::fs::write(
        &broken,
        "{\"step\": 0, \"loss\": 1.0}\nnot json\n{\"step\": 1, \"loss\": 0.9}\n",
    )
    .unwrap();
    let good = dir.path().join("good.jsonl");
    std::fs::write(
        &good,
        "{\"step\": 0, \"loss\": 1.0, \"lr\": 0.1, \"tokens_per_s\": 5.0}\n",
    )
    .unwrap();
    let nowhere = dir.path().join("no/such/folder/out.png");
    let cases: [(Vec<&str>, &str); 5] = [
        (vec![s(&missing)], "cannot read"),
        (vec![s(&empty)], "has no steps to plot"),
        (vec![s(&broken)], "line 2"),
        (vec![s(&good), "-o", s(&nowhere)], "does not exist"),
        (vec![s(&good), "-o", s(&good)], "the plot is a PNG"),
    ];
    for (args, says) in cases {
        let out = plot(&args);
        assert!(!out.status.success(), "{args:?}");
        let lines = error_lines(&out);
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        assert!(lines[0].contains(says), "{args:?}: {lines:?}");
    }
    assert!(!dir.path().join("empty.png").exists() && !dir.path().join("broken.png").exists());
}
