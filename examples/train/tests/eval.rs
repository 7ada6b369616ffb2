//! Held-out evaluation (`--eval-data`, `--eval-split`, `--eval-every`,
//! `--keep-best`): when it runs, that it never changes the training, that
//! its loss is the mean loss of the held-out tokens, that the best
//! checkpoint outlives rotation and resumes, and that bad input is refused.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use burn::prelude::*;
use burn_offload::{BlockModel, Compute};
use common::{checkpoint_names, error_lines, llama3_checkpoint, metrics, train};
use models::ModelConfig;
use trainer::data::EvalWindows;
use trainer::instruct::{self, DataFormat, Shaping};
use trainer::load::ModelFolder;
use trainer::DefaultBackend as B;

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Prose for the text runs: the training corpus and a different held-out one.
fn corpora(dir: &Path) -> (PathBuf, PathBuf) {
    let train = "the quick brown fox jumps over the lazy dog. ".repeat(40);
    let eval = "a stitch in time saves nine, and so does a fox. ".repeat(6);
    (
        write(dir, "train.txt", &train),
        write(dir, "eval.txt", &eval),
    )
}

/// Alpaca records for the instruction runs (packed, so the evaluation
/// batches carry document boundaries).
fn records(dir: &Path, name: &str, from: usize, count: usize) -> PathBuf {
    let lines: String = (from..from + count)
        .map(|i| {
            format!(
                "{{\"instruction\": \"Add {i} and {i}.\", \"input\": \"\", \"output\": \"{}\"}}\n",
                2 * i
            )
        })
        .collect();
    write(dir, name, &lines)
}

/// Each step's loss line, as written (bit for bit).
fn step_losses(lines: &[serde_json::Value]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.get("loss").map(|v| v.to_string()))
        .collect()
}

/// The evaluation lines: (step, eval_loss, best).
fn evals(lines: &[serde_json::Value]) -> Vec<(u64, f64, bool)> {
    lines
        .iter()
        .filter(|l| l.get("eval_loss").is_some())
        .map(|l| {
            (
                l["step"].as_u64().unwrap(),
                l["eval_loss"].as_f64().unwrap(),
                l["best"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Evaluations run after every `--eval-every` steps and at the end, and a
/// run's training losses are the same bit for bit with and without them:
/// on a text corpus (the engine's and plain burn's loops), and on packed
/// instruction data (held out as JSON Lines, and as Parquet).
#[test]
fn evaluation_runs_when_asked_and_never_changes_the_training() {
    let dir = tempfile::tempdir().unwrap();
    let (data, eval) = corpora(dir.path());
    let ck = llama3_checkpoint(dir.path());
    let (train_records, eval_records) = (
        records(dir.path(), "train.jsonl", 0, 12),
        records(dir.path(), "eval.jsonl", 50, 5),
    );
    let alpaca_parquet = common::fixtures().join("parquet/alpaca.parquet");
    let instructions = vec![
        "--init-from",
        s(&ck),
        "--data",
        s(&train_records),
        "--batch",
        "2",
        "--seq-len",
        "64",
    ];
    let cases: [(Vec<&str>, &Path); 4] = [
        (
            vec!["--data", s(&data), "--batch", "2", "--seq-len", "16"],
            &eval,
        ),
        (
            vec![
                "--resident",
                "--data",
                s(&data),
                "--batch",
                "2",
                "--seq-len",
                "16",
            ],
            &eval,
        ),
        (instructions.clone(), &eval_records),
        (instructions.clone(), &alpaca_parquet),
    ];
    for (i, (base, eval)) in cases.iter().enumerate() {
        let run = |name: &str, extra: &[&str]| {
            let path = dir.path().join(format!("{name}-{i}.jsonl"));
            let common = [
                "--steps",
                "5",
                "--sample-tokens",
                "0",
                "--metrics",
                s(&path),
            ];
            ok(&train(&[&base[..], &common].concat(), extra));
            metrics(&path)
        };
        let plain = run("plain", &[]);
        let evaluated = run("eval", &["--eval-data", s(eval), "--eval-every", "2"]);
        assert_eq!(step_losses(&plain).len(), 5);
        assert_eq!(step_losses(&plain), step_losses(&evaluated), "case {i}");
        let steps: Vec<u64> = evals(&evaluated).iter().map(|e| e.0).collect();
        // After steps 2 and 4, and at the end: the lines name the step
        // evaluated after, as its own line does (from 0).
        assert_eq!(steps, [1, 3, 4], "case {i}");
        let at_end = run("end", &["--eval-data", s(eval)]);
        assert_eq!(evals(&at_end).len(), 1, "case {i}");
        assert_eq!(evals(&at_end)[0].1, evals(&evaluated)[2].1, "case {i}");
    }
}

/// The loss the run reports is the mean loss over the held-out windows'
/// trained tokens under the model it exported, computed here with plain
/// burn on the whole model (the engine's streamed forward and chunked loss
/// against a resident forward): text windows, and packed instruction
/// windows whose prompts are not trained on.
#[test]
fn the_eval_loss_is_the_mean_loss_of_the_held_out_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let (data, eval) = corpora(dir.path());
    let ck = llama3_checkpoint(dir.path());
    let train_records = records(dir.path(), "train.jsonl", 0, 12);
    let eval_records = records(dir.path(), "eval.jsonl", 50, 7);
    let seq_len = 64;
    let run = |name: &str, args: &[&str]| -> (f64, PathBuf) {
        let out = dir.path().join(name);
        let path = dir.path().join(format!("{name}.jsonl"));
        let common = [
            "--steps",
            "3",
            "--batch",
            "2",
            "--seq-len",
            "64",
            "--sample-tokens",
            "0",
        ];
        let files = ["--metrics", s(&path), "--export-hf", s(&out)];
        ok(&train(&[&common[..], &files].concat(), args));
        (
            *evals(&metrics(&path)).last().map(|(_, l, _)| l).unwrap(),
            out,
        )
    };

    let (reported, out) = run("text", &["--data", s(&data), "--eval-data", s(&eval)]);
    let folder = ModelFolder::open(&out, Some("byte")).unwrap();
    let tokens = folder
        .tokenizer
        .encode(&std::fs::read_to_string(&eval).unwrap());
    let windows = EvalWindows::stream(tokens, seq_len).unwrap();
    assert_close(reported, reference_loss(&folder, &windows, &device));

    let (reported, out) = run(
        "instructions",
        &[
            "--init-from",
            s(&ck),
            "--data",
            s(&train_records),
            "--eval-data",
            s(&eval_records),
        ],
    );
    let folder = ModelFolder::open(&out, None).unwrap();
    let shaping = Shaping {
        format: DataFormat::Alpaca,
        seq_len,
        train_on_prompt: false,
        packing: true,
    };
    let prepared = instruct::prepare(&eval_records, shaping, &folder.tokenizer).unwrap();
    assert!(
        prepared.trained < prepared.windows.inputs.len(),
        "prompts are not trained on"
    );
    let windows = EvalWindows::windows(prepared.windows).unwrap();
    assert_close(reported, reference_loss(&folder, &windows, &device));
}

fn assert_close(reported: f64, reference: f64) {
    assert!(
        (reported - reference).abs() <= 1e-5 * reference.abs(),
        "reported {reported}, reference {reference}"
    );
}

/// The mean loss of `windows`' trained targets under `folder`'s model,
/// loaded whole, from burn's forward and the reference cross-entropy.
fn reference_loss(
    folder: &ModelFolder,
    windows: &EvalWindows,
    device: &burn::tensor::Device<B>,
) -> f64 {
    match &folder.config {
        ModelConfig::Llama(c) => {
            let model = folder.resident::<B, _>(|| c.init(device), Compute::Fp32, device);
            mean_loss(&model.unwrap(), windows, device)
        }
        ModelConfig::Gpt2(c) => {
            let model = folder.resident::<B, _>(|| c.init(device), Compute::Fp32, device);
            mean_loss(&model.unwrap(), windows, device)
        }
    }
}

fn mean_loss<M: BlockModel<B>>(
    model: &M,
    windows: &EvalWindows,
    device: &burn::tensor::Device<B>,
) -> f64 {
    let (mut sum, mut count) = (0.0, 0usize);
    for batch in windows.batches(2, 0, 1) {
        let seq_len = batch.inputs.len() / batch.rows;
        let tensor = |v: &Vec<i64>| {
            Tensor::<B, 2, Int>::from_data(
                TensorData::new(v.clone(), [batch.rows, seq_len]),
                device,
            )
        };
        let (inputs, targets) = (tensor(&batch.inputs), tensor(&batch.targets));
        let trained = batch.targets.iter().filter(|&&t| t >= 0).count();
        let logits = match &batch.documents {
            Some(documents) => model.forward_in(inputs, documents),
            None => model.forward(inputs),
        };
        let mean: f32 = models::cross_entropy(logits, targets).into_scalar().elem();
        sum += f64::from(mean) * trained as f64;
        count += trained;
    }
    assert_eq!(count, windows.trained());
    sum / count as f64
}

/// `--keep-best` keeps the checkpoint of the lowest eval loss through
/// rotation (`--keep 1`) and through a resume that names only the folder;
/// the resumed run keeps evaluating on the same schedule. Training on one
/// text while evaluating on another makes the first evaluation the best.
#[test]
fn keep_best_keeps_the_best_through_rotation_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let data = write(dir.path(), "train.txt", &"abab".repeat(400));
    let eval = write(dir.path(), "eval.txt", &"the quick brown fox. ".repeat(20));
    let ck = dir.path().join("ck");
    let path = dir.path().join("m.jsonl");
    let first = train(
        &[
            "--data",
            s(&data),
            "--eval-data",
            s(&eval),
            "--eval-every",
            "1",
            "--keep-best",
            "--checkpoint-dir",
            s(&ck),
            "--keep",
            "1",
            "--checkpoint-every",
            "1",
            "--steps",
            "6",
            "--stop-after",
            "3",
            "--warmup",
            "0",
            "--lr",
            "1e-2",
            "--batch",
            "2",
            "--seq-len",
            "16",
            "--sample-tokens",
            "0",
            "--metrics",
            s(&path),
        ],
        &[],
    );
    ok(&first);
    let before = evals(&metrics(&path));
    assert_eq!(before.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(before[0].2 && !before[1].2 && !before[2].2, "{before:?}");
    assert_eq!(checkpoint_names(&ck), ["step-00000001", "step-00000003"]);

    let resumed = train(&["--resume", s(&ck)], &[]);
    ok(&resumed);
    let all = evals(&metrics(&path));
    assert_eq!(
        all.iter().map(|e| e.0).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 5]
    );
    assert!(all[3..].iter().all(|e| !e.2 && e.1 > all[0].1), "{all:?}");
    assert_eq!(checkpoint_names(&ck), ["step-00000001", "step-00000006"]);
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    assert!(
        stdout.contains(&format!("best eval loss {:.4} after step 1", all[0].1)),
        "{stdout}"
    );
}

/// Bad evaluation input: one `error:` line naming the flag, a failure, and
/// nothing written (no metrics file, no checkpoint folder).
#[test]
fn bad_evaluation_input_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = corpora(dir.path());
    let missing = dir.path().join("missing.jsonl");
    let path = dir.path().join("m.jsonl");
    let ck = dir.path().join("ck");
    let base = [
        "--data",
        s(&data),
        "--steps",
        "2",
        "--batch",
        "1",
        "--seq-len",
        "16",
        "--metrics",
        s(&path),
        "--checkpoint-dir",
        s(&ck),
    ];
    let no_column = common::fixtures().join("parquet/no_usable_column.parquet");
    let cases: [(&[&str], String); 8] = [
        (
            &["--eval-data", s(&no_column)],
            format!(
                "error: --eval-data `{}` has no `text`, `instruction` (alpaca), `conversations` \
                 (sharegpt) or `messages` (chat) column (its columns: `id`, `score`)",
                s(&no_column)
            ),
        ),
        (
            &["--eval-data", s(&missing)],
            format!("error: --eval-data `{}` does not exist", s(&missing)),
        ),
        (
            &["--eval-split", "0"],
            "error: --eval-split must be a fraction between 0 and 1 (both excluded), got 0".into(),
        ),
        (
            &["--eval-split", "1"],
            "error: --eval-split must be a fraction between 0 and 1 (both excluded), got 1".into(),
        ),
        (
            &["--eval-every", "5"],
            "error: --eval-every needs --eval-data or --eval-split".into(),
        ),
        (
            &["--keep-best"],
            "error: --keep-best needs --eval-data or --eval-split".into(),
        ),
        (
            &["--eval-split", "0.1", "--eval-data", s(&data)],
            "error: --eval-split holds out part of --data; give it or --eval-data, not both".into(),
        ),
        (
            &["--eval-split", "0.001"],
            "error: --eval-split 0.001 holds out 2 of the data's 1800 tokens, fewer than one \
             window's 17 (--seq-len + 1); raise it or give --eval-data"
                .into(),
        ),
    ];
    for (args, expected) in cases {
        let out = train(&base, args);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(error_lines(&out), [expected], "{args:?}");
        assert!(!path.exists() && !ck.exists(), "{args:?} wrote something");
    }
}

/// `--eval-split` holds out a text corpus's last tokens (its windows
/// evaluated whole) and a share of the instruction windows, and a run
/// resumed from its folder alone keeps the same split.
#[test]
fn an_eval_split_holds_out_part_of_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = corpora(dir.path());
    let ck = llama3_checkpoint(dir.path());
    let train_records = records(dir.path(), "train.jsonl", 0, 12);
    let eval_tokens = |args: &[&str], name: &str| -> Vec<u64> {
        let path = dir.path().join(format!("{name}.jsonl"));
        let common = [
            "--batch",
            "2",
            "--sample-tokens",
            "0",
            "--metrics",
            s(&path),
        ];
        ok(&train(&common, args));
        metrics(&path)
            .iter()
            .filter_map(|l| l.get("eval_tokens").and_then(|t| t.as_u64()))
            .collect()
    };
    let ckpts = dir.path().join("ck");
    let text = [
        "--data",
        s(&data),
        "--seq-len",
        "16",
        "--eval-split",
        "0.2",
        "--steps",
        "4",
        "--stop-after",
        "2",
        "--eval-every",
        "2",
        "--checkpoint-dir",
        s(&ckpts),
    ];
    // 1800 bytes: the last 360 held out, 22 windows of 16 targets each.
    assert_eq!(eval_tokens(&text, "text"), [352]);
    let path = dir.path().join("text.jsonl");
    ok(&train(&["--resume", s(&ckpts)], &[]));
    let resumed: Vec<u64> = metrics(&path)
        .iter()
        .filter_map(|l| l.get("eval_tokens").and_then(|t| t.as_u64()))
        .collect();
    assert_eq!(resumed, [352, 352]);
    let instructions = [
        "--init-from",
        s(&ck),
        "--data",
        s(&train_records),
        "--seq-len",
        "64",
        "--eval-split",
        "0.25",
        "--steps",
        "2",
    ];
    let held = eval_tokens(&instructions, "instructions");
    assert_eq!(held.len(), 1);
    assert!(held[0] > 0, "{held:?}");
}
