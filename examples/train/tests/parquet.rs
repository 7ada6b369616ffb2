//! `train --data` on Parquet files (tests/fixtures/parquet, made by
//! tests/fixtures/parquet.py): each layout trains exactly as the same
//! records in JSON do, a folder of shards as their concatenation, a changed
//! file is tokenized again, and a file that is not Parquet or has no usable
//! column is one `error:` line before anything is written.

use std::path::{Path, PathBuf};

use trainer::data::read_corpus;
use trainer::data::token_cache::{tokenize, TokenFile};
use trainer::tokenizer::Tokenizer;

mod common;

fn parquet(name: &str) -> PathBuf {
    common::fixtures().join("parquet").join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// What a run shows of its data: the per-step losses, and the stderr line
/// that starts with `summary` (the instruction data's counts), its
/// tokenizing rate left out.
#[derive(Debug, PartialEq)]
struct Trained {
    losses: Vec<f64>,
    summary: Option<String>,
}

/// Trains on `data` with `args` in `dir`, a metrics file of its own.
fn trained(dir: &Path, data: &Path, args: &[&str], summary: Option<&str>) -> Trained {
    let metrics = dir.join(format!("m-{}.jsonl", rand_name()));
    let out = common::train(args, &["--data", s(data), "--metrics", s(&metrics)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", data.display());
    let losses: Vec<f64> = common::metrics(&metrics)
        .iter()
        .filter_map(|m| m["loss"].as_f64())
        .collect();
    assert!(!losses.is_empty(), "{err}");
    let summary = summary.map(|start| {
        let line = err.lines().find(|l| l.starts_with(start)).expect(start);
        let (counts, rest) = line.split_once(" tokens (").expect(line);
        let (_, after) = rest.split_once(" tok/s tokenized)").expect(line);
        format!("{counts} tokens{after}")
    });
    Trained { losses, summary }
}

fn rand_name() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed).to_string()
}

/// Text in a `text` column: the rows are the documents of a `.jsonl` file
/// with the same records (an empty one skipped, a blank line inside one
/// kept), and two shards under `data/` are their concatenation.
#[test]
fn a_text_column_trains_as_the_same_jsonl_and_shards_as_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let args = [
        &["--steps", "3", "--data-cache", s(&cache)][..],
        &common::FAST,
    ]
    .concat();
    let jsonl = trained(dir.path(), &parquet("text.jsonl"), &args, None);
    let file = trained(dir.path(), &parquet("text.parquet"), &args, None);
    let shards = trained(dir.path(), &parquet("shards"), &args, None);
    assert_eq!(file.losses, jsonl.losses);
    assert_eq!(shards.losses, file.losses);
    assert_eq!(jsonl.losses.len(), 3);
}

fn ids(file: &TokenFile) -> Vec<u32> {
    (0..file.len()).map(|i| file.get(i)).collect()
}

/// With a BPE tokenizer, where a blank line between documents encodes
/// otherwise than the separator's own ids, the rows of a Parquet file give
/// the ids of the JSONL file with the same records, and shards continue
/// one another as the rows of one file do.
#[test]
fn parquet_rows_tokenize_as_jsonl_lines_and_shards_as_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let gpt2 = Tokenizer::from_name("gpt2").unwrap();
    let tokens = |data: &Path| {
        let tokenized = tokenize(data, &gpt2, &dir.path().join("cache")).unwrap();
        (ids(&tokenized.tokens), tokenized.crc32)
    };
    let jsonl = tokens(&parquet("text.jsonl"));
    assert_eq!(tokens(&parquet("text.parquet")), jsonl);
    assert_eq!(tokens(&parquet("shards")), jsonl);
    assert_eq!(
        read_corpus(&parquet("text.parquet")).unwrap(),
        read_corpus(&parquet("text.jsonl")).unwrap()
    );
}

/// The token cache's key covers a Parquet file: the same file is read from
/// the cache, a changed one tokenized again.
#[test]
fn a_changed_parquet_file_is_tokenized_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("train.parquet");
    let cache = dir.path().join("cache");
    let run = || {
        let args = [
            &["--steps", "1", "--data-cache", s(&cache)][..],
            &common::FAST,
        ]
        .concat();
        let out = common::train(&args, &["--data", s(&data)]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err
    };
    std::fs::copy(parquet("text.parquet"), &data).unwrap();
    assert!(run().contains("tokenized at"));
    assert!(run().contains("read from"));
    std::fs::copy(parquet("shards/data/train-00000-of-00002.parquet"), &data).unwrap();
    let changed = run();
    assert!(changed.contains("tokenized at"), "{changed}");
}

/// Alpaca, sharegpt and chat columns give the examples, windows and losses
/// the same records in JSON give.
#[test]
fn instruction_columns_train_as_the_same_json_records() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = common::llama3_checkpoint(dir.path());
    let args = [
        &common::FINETUNE[..],
        &["--init-from", s(&ckpt), "--seq-len", "64", "--steps", "3"],
    ]
    .concat();
    for (json, format) in [
        ("alpaca.json", "alpaca"),
        ("sharegpt.jsonl", "sharegpt"),
        ("chat.jsonl", "chat"),
    ] {
        let summary = format!("{format} data: ");
        let from_json = trained(dir.path(), &parquet(json), &args, Some(&summary));
        let file = parquet(&format!("{format}.parquet"));
        let from_parquet = trained(dir.path(), &file, &args, Some(&summary));
        assert_eq!(from_parquet, from_json, "{format}");
    }
}

/// One `error:` line naming `--data`, the file and `expected`, a non-zero
/// exit, and no checkpoint folder or metrics file.
fn refused(data: &Path, extra: &[&str], expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (ck, m) = (dir.path().join("ck"), dir.path().join("m.jsonl"));
    let args = [
        &[
            "--data",
            s(data),
            "--checkpoint-dir",
            s(&ck),
            "--metrics",
            s(&m),
        ][..],
        extra,
    ]
    .concat();
    let out = common::train(&common::FAST, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!err.contains("panicked"), "{err}");
    let lines = common::error_lines(&out);
    assert_eq!(lines.len(), 1, "{err}");
    let want = format!("error: --data `{}`", data.display());
    assert!(lines[0].starts_with(&want), "want `{want}`: {}", lines[0]);
    assert!(
        lines[0].contains(expected),
        "want `{expected}`: {}",
        lines[0]
    );
    assert!(
        !ck.exists() && !m.exists(),
        "{args:?}: something was written"
    );
}

#[test]
fn a_file_that_is_not_parquet_or_has_no_usable_column_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("train.parquet");
    std::fs::write(&text, "plain text, not Parquet\n").unwrap();
    refused(&text, &[], "is not a Parquet file that can be read");
    // Cut short: the magic is there, the footer is not.
    let bytes = std::fs::read(parquet("text.parquet")).unwrap();
    let cut = dir.path().join("cut.parquet");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    refused(&cut, &[], "is not a Parquet file that can be read");

    let none = parquet("no_usable_column.parquet");
    let columns = "(its columns: `id`, `score`)";
    refused(&none, &[], columns);
    refused(&none, &["--data-format", "text"], "has no `text` column");
    // A format asked for that the columns do not hold.
    refused(
        &parquet("text.parquet"),
        &["--data-format", "chat"],
        "has no `messages` column, which chat data needs (its columns: `id`, `text`)",
    );

    // A row without a string, as a JSON line without one, names itself;
    // the token cache keeps nothing of the run.
    let cache = dir.path().join("cache");
    refused(
        &parquet("null_text.parquet"),
        &["--data-cache", s(&cache)],
        "row 2: no string in column `text`",
    );
    let kept: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert!(kept.is_empty(), "{kept:?}");

    // A bad shard in a folder is refused before the good ones are read.
    let folder = dir.path().join("dataset");
    std::fs::create_dir_all(folder.join("data")).unwrap();
    std::fs::copy(parquet("text.parquet"), folder.join("data/a.parquet")).unwrap();
    std::fs::copy(&none, folder.join("data/b.parquet")).unwrap();
    let shard = folder.join("data/b.parquet");
    let out = common::train(&common::FAST, &["--data", s(&folder)]);
    let lines = common::error_lines(&out);
    assert!(!out.status.success());
    assert_eq!(
        lines,
        [format!(
            "error: --data `{}` has no `text` column {columns}",
            shard.display()
        )]
    );
}
