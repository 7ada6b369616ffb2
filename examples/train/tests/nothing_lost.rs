//! Nothing overwritten, nothing silent: the export never replaces a folder
//! unasked and is a whole Hugging Face folder, a run that would train on
//! nothing is refused, errors are one line naming the user's flag, and a run
//! says what it does when nobody watches a terminal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{error_lines, fixtures, llama3_checkpoint};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A short fine-tuning run of the llama3 fixture plus `args`.
fn finetune(args: &[&str]) -> Output {
    common::train(&common::FINETUNE, args)
}

/// A short fine-tune of `ck` on `data` exported to `export`, plus `args`.
fn export_run(ck: &Path, data: &Path, export: &Path, args: &[&str]) -> Output {
    let base = [
        "--init-from",
        s(ck),
        "--data",
        s(data),
        "--export-hf",
        s(export),
    ];
    finetune(&[&base[..], args].concat())
}

/// A tiny, fast run plus `args`.
fn tiny(args: &[&str]) -> Output {
    common::train(&[&["--steps", "1"][..], &common::FAST].concat(), args)
}

const CHAT: &str = r#"{"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}]}
{"messages": [{"role": "system", "content": "You count."}, {"role": "user", "content": "One?"}, {"role": "assistant", "content": "Two."}]}
"#;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Every file under `dir`: relative path → (length, CRC32).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (usize, u32)> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                let digest = (bytes.len(), crc32fast::hash(&bytes));
                files.insert(path.strip_prefix(dir).unwrap().to_path_buf(), digest);
            }
        }
    }
    files
}

/// Asserts that the run failed with exactly `expected` as its one error line.
fn assert_error(out: &Output, expected: &str) {
    assert!(!out.status.success(), "succeeded; want `{expected}`");
    let err = stderr(out);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(error_lines(out), [expected], "stderr:\n{err}");
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Item 1: exporting into the checkpoint a run starts from, into a folder
/// inside it, or over an earlier export is refused before the first step and
/// leaves every file as it was; `--overwrite` replaces an export whole.
#[test]
fn an_export_never_replaces_a_folder_unasked() {
    let dir = tempfile::tempdir().unwrap();
    let ck = llama3_checkpoint(dir.path());
    let data = write(dir.path(), "chat.jsonl", CHAT);
    let source = snapshot(&ck);
    let over_source = |export: &Path| export_run(&ck, &data, export, &[]);
    assert_error(
        &over_source(&ck),
        &format!(
            "error: --export-hf `{}` is the --init-from folder: the export would overwrite the \
             checkpoint this run starts from; choose another folder, or add --overwrite to \
             replace it",
            s(&ck)
        ),
    );
    let inside = ck.join("export");
    assert_error(
        &over_source(&inside),
        &format!(
            "error: --export-hf `{}` is inside the --init-from folder `{}`: the export would \
             overwrite the checkpoint this run starts from; choose another folder, or add \
             --overwrite to replace it",
            s(&inside),
            s(&ck)
        ),
    );
    assert_eq!(snapshot(&ck), source, "the source changed");

    // The first export is written and said; the same command again is refused.
    let export = dir.path().join("export");
    let out = over_source(&export);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("export: {} (a Hugging Face folder)", s(&export))),
        "{}",
        stdout(&out)
    );
    let first = snapshot(&export);
    assert_error(
        &over_source(&export),
        &format!(
            "error: --export-hf `{}` already holds files (config.json, generation_config.json, \
             model.safetensors and 2 more); choose a new or empty folder, or add --overwrite \
             to replace it",
            s(&export)
        ),
    );
    assert_eq!(snapshot(&export), first, "the first export changed");

    // --overwrite replaces it whole, through a folder beside it.
    let out = export_run(&ck, &data, &export, &["--overwrite", "--steps", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let second = snapshot(&export);
    assert_eq!(
        second.keys().collect::<Vec<_>>(),
        first.keys().collect::<Vec<_>>()
    );
    assert_ne!(second, first, "--overwrite did not write the new weights");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // The checkpoint folder, or a folder holding a source, never.
    let checkpoints = dir.path().join("checkpoints");
    let out = export_run(
        &ck,
        &data,
        &checkpoints,
        &["--checkpoint-dir", s(&checkpoints), "--overwrite"],
    );
    assert_error(
        &out,
        &format!(
            "error: --export-hf `{}` is the --checkpoint-dir folder: the export would replace \
             this run's checkpoints; choose another folder",
            s(&checkpoints)
        ),
    );
    assert!(
        !checkpoints.exists(),
        "refused after the checkpoint folder was made"
    );
    assert_error(
        &export_run(&ck, &data, dir.path(), &["--overwrite"]),
        &format!(
            "error: --export-hf `{}` holds the --init-from folder `{}`: replacing it would \
             delete that; choose another folder",
            s(dir.path()),
            s(&ck)
        ),
    );
    assert_eq!(snapshot(&ck), source, "the source changed");
}

/// Item 2: the export carries the source's special-token ids and
/// generation config and the tokenizer's files; from a tokenizer alone, its
/// ids.
#[test]
fn the_export_is_a_whole_hugging_face_folder() {
    let dir = tempfile::tempdir().unwrap();
    let ck = llama3_checkpoint(dir.path());
    let data = write(dir.path(), "chat.jsonl", CHAT);
    let export = dir.path().join("export");
    let out = export_run(&ck, &data, &export, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (ours, theirs) = (
        json(&export.join("config.json")),
        json(&ck.join("config.json")),
    );
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        assert!(ours.get(key).is_some(), "config.json lacks {key}");
        assert_eq!(ours[key], theirs[key], "{key}");
    }
    for file in [
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert_eq!(
            std::fs::read(export.join(file)).unwrap(),
            std::fs::read(ck.join(file)).unwrap(),
            "{file}"
        );
    }

    // A model trained from scratch with a Hugging Face tokenizer: the
    // tokenizer's special tokens.
    let scratch = dir.path().join("scratch");
    let tokenizer = fixtures().join("tokenizer");
    let out = finetune(&[
        "--model",
        "llama-tiny",
        "--tokenizer",
        s(&tokenizer),
        "--data",
        s(&data),
        "--export-hf",
        s(&scratch),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let config = json(&scratch.join("config.json"));
    let generation = json(&scratch.join("generation_config.json"));
    let vocab = json(&tokenizer.join("tokenizer.json"));
    let id = |token: &str| {
        vocab["added_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["content"] == token)
            .unwrap()["id"]
            .clone()
    };
    for (key, token) in [
        ("bos_token_id", "<|begin_of_text|>"),
        ("eos_token_id", "<|eot_id|>"),
    ] {
        assert_eq!(config[key], id(token), "config.json {key}");
        assert_eq!(generation[key], id(token), "generation_config.json {key}");
    }
}

/// Item 3: examples cut before their first trained token by `--seq-len` are
/// refused before the first step (nothing written); a run where some are
/// says so, and its metrics count the trained tokens of every step.
#[test]
fn a_run_that_would_train_on_nothing_is_refused_before_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let ck = llama3_checkpoint(dir.path());
    let long = |words: usize| {
        format!(
            "{{\"instruction\": \"{}\", \"output\": \"ok\"}}\n",
            "many words ".repeat(words)
        )
    };
    let data = write(
        dir.path(),
        "long.jsonl",
        &[long(30), long(40), long(35)].concat(),
    );
    let (checkpoints, metrics) = (dir.path().join("ck"), dir.path().join("m.jsonl"));
    let out = finetune(&[
        "--init-from",
        s(&ck),
        "--data",
        s(&data),
        "--checkpoint-dir",
        s(&checkpoints),
        "--metrics",
        s(&metrics),
    ]);
    assert!(!out.status.success(), "{}", stderr(&out));
    let lines = error_lines(&out);
    assert_eq!(lines.len(), 1, "{}", stderr(&out));
    let prefix = format!(
        "error: --seq-len 32 leaves no token to train on in any of the 3 examples (the \
         longest, `{}` line 2, has ",
        s(&data)
    );
    assert!(
        lines[0].starts_with(&prefix) && lines[0].ends_with(" tokens); raise --seq-len"),
        "{}",
        lines[0]
    );
    assert!(
        !checkpoints.exists() && !metrics.exists(),
        "something was written"
    );
    assert!(
        !stderr(&out).contains("host store ready"),
        "built before refusing"
    );

    // One example of three cut: trained, with a warning; every step trains.
    let some = write(
        dir.path(),
        "some.jsonl",
        &[
            long(40),
            "{\"instruction\": \"Name a colour.\", \"output\": \"Blue.\"}\n".to_string(),
            "{\"instruction\": \"Add 2 and 3.\", \"output\": \"5\"}\n".to_string(),
        ]
        .concat(),
    );
    let out = finetune(&[
        "--init-from",
        s(&ck),
        "--data",
        s(&some),
        "--metrics",
        s(&metrics),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("warning: --seq-len 32 leaves no token to train on in 1 of the 3 examples"),
        "{}",
        stderr(&out)
    );
    let steps = common::metrics(&metrics);
    assert_eq!(steps.len(), 2);
    for step in &steps {
        assert!(step["trained_tokens"].as_u64().unwrap() > 0, "{step}");
    }
}

/// Item 5: each of these is one line, said once, naming the flag given.
#[test]
fn errors_are_one_cause_said_once_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let fused = tiny(&["--fused", "--accum", "2"]);
    assert_error(
        &fused,
        "error: --fused cannot accumulate --accum 2 micro-batches: it applies each block's \
         update as the backward reaches it; drop --fused or --accum",
    );
    assert!(!stderr(&fused).contains("host store"), "{}", stderr(&fused));
    let launched = tiny(&["--processes", "2", "--resident"]);
    assert_error(
        &launched,
        "error: --processes is an option of the offload engine; drop it or --resident",
    );
    assert_eq!(
        stderr(&launched).lines().count(),
        1,
        "{}",
        stderr(&launched)
    );
    assert_error(
        &tiny(&["--host-mem-gib", "0.1"]),
        "error: not enough host memory: needs 1.25 GiB (16 B/param in the store, buffers, the \
         runtime and the OS's headroom; --plan lists them), 0.10 GiB available \
         (--host-mem-gib); the runtime and the OS's headroom alone take 1.25 GiB",
    );
    assert_error(
        &tiny(&["--lr", "-1"]),
        "error: --lr must be a positive number, got -1",
    );
    let folder = fixtures().join("families/llama3");
    assert_error(
        &tiny(&["--model", s(&folder)]),
        &format!(
            "error: --model `{}` is a folder; --model takes a preset name or a config .json \
             file (a Hugging Face checkpoint folder goes to --init-from)",
            s(&folder)
        ),
    );
    assert_error(
        &tiny(&["--data", "/dev/null"]),
        "error: --data `/dev/null` is neither a file nor a folder",
    );
    // A chat template that fails on one record names itself, the flag that
    // brought it, and the record.
    let ck = llama3_checkpoint(dir.path());
    let config = ck.join("tokenizer_config.json");
    let mut tokenizer_config = json(&config);
    tokenizer_config["chat_template"] = "{% if messages | length > 2 %}{{ raise_exception(\
        'Conversation roles must alternate') }}{% endif %}{% for m in messages %}\
        {{ m.content }}{% endfor %}"
        .into();
    std::fs::write(&config, tokenizer_config.to_string()).unwrap();
    let mut records = String::new();
    for i in 1..=15 {
        let system = if i == 13 {
            r#"{"role": "system", "content": "Be brief."}, "#
        } else {
            ""
        };
        records.push_str(&format!(
            "{{\"messages\": [{system}{{\"role\": \"user\", \"content\": \"{i}?\"}}, \
             {{\"role\": \"assistant\", \"content\": \"{i}.\"}}]}}\n"
        ));
    }
    let data = write(dir.path(), "records.jsonl", &records);
    for (flags, origin) in [
        (vec!["--init-from", s(&ck)], "--init-from"),
        (
            vec!["--init-from", s(&ck), "--tokenizer", s(&ck)],
            "--tokenizer",
        ),
    ] {
        let out = finetune(&[&flags[..], &["--data", s(&data)]].concat());
        assert_error(
            &out,
            &format!(
                "error: the chat template of `{}` (from {origin}) fails on `{}` line 13: invalid \
                 operation: Conversation roles must alternate (in chat:1)",
                s(&config),
                s(&data)
            ),
        );
    }
}

/// Item 6: with stderr not a terminal, plain progress lines; a resume says
/// so; a checkpoint without a tokenizer warns that bytes are used; the
/// fine-tuning example folder carries its tokenizer.
#[test]
fn a_run_says_what_it_does_when_no_terminal_watches() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let out = tiny(&[
        "--steps",
        "4",
        "--stop-after",
        "2",
        "--checkpoint-dir",
        s(&ck),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let plain = |line: &str, step: &str| {
        line.starts_with(&format!("step {step}/4 · loss "))
            && line.contains(" tok/s · 8 trained tokens · ETA ")
    };
    assert!(err.lines().any(|l| plain(l, "1")), "{err}");
    assert!(err.lines().any(|l| plain(l, "2")), "{err}");
    let out = tiny(&[
        "--steps",
        "4",
        "--resume",
        s(&ck),
        "--checkpoint-dir",
        s(&ck),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "resumed from `{}` at step 2 of 4",
            s(&ck.join("step-00000002"))
        )),
        "{err}"
    );
    assert!(err.lines().any(|l| plain(l, "4")), "{err}");

    // A checkpoint without tokenizer.json: bytes, said.
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(
            fixtures().join("families/llama3").join(file),
            bare.join(file),
        )
        .unwrap();
    }
    let out = tiny(&["--init-from", s(&bare)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "warning: --init-from `{}` has no tokenizer.json: tokenizing as bytes (256 ids); \
             give --tokenizer the model's tokenizer.json",
            s(&bare)
        )),
        "{}",
        stderr(&out)
    );
    // The fine-tuning example's folder (bench/hf/readme.sh, the README
    // test's stand-in checkpoint) has its tokenizer.
    let example = fixtures().join("families/llama3");
    assert!(example.join("tokenizer.json").is_file());
    let out = tiny(&["--init-from", s(&example)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

/// Item 7: the default run (the README's first command) ends with a sample
/// that reads as text: mostly the built-in corpus's words, no word or
/// phrase looping.
#[test]
fn the_default_runs_sample_reads_as_text() {
    let out = common::train(&[], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let sample = text
        .split("--- sample ---\n")
        .nth(1)
        .expect("a sample")
        .trim()
        .to_string();
    let vocabulary: std::collections::HashSet<String> = trainer::data::default_corpus()
        .split_whitespace()
        .map(word)
        .collect();
    let words: Vec<String> = sample.split_whitespace().map(word).collect();
    assert!(words.len() >= 20, "{sample}");
    let known = words.iter().filter(|w| vocabulary.contains(*w)).count();
    assert!(
        known * 10 >= words.len() * 7,
        "{known} of {} words are the corpus's: {sample}",
        words.len()
    );
    let mut phrases = BTreeMap::new();
    for three in words.windows(3) {
        *phrases.entry(three.join(" ")).or_insert(0) += 1;
    }
    let (phrase, count) = phrases.iter().max_by_key(|(_, &n)| n).unwrap();
    assert!(*count <= 3, "`{phrase}` {count} times: {sample}");
}

/// A word without the punctuation around it, in lower case.
fn word(raw: &str) -> String {
    raw.trim_matches(|c: char| !c.is_alphanumeric())
        .to_lowercase()
}
