//! `train` on instruction data: alpaca, sharegpt and chat records with a
//! checkpoint's tokenizer and chat template, and every bad input a one-line
//! error before anything is written.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;

/// A Llama 3-style checkpoint folder: the llama3 family fixture (vocabulary
/// 3000) with the fixture tokenizer (662 tokens, Llama 3's chat template).
fn checkpoint(dir: &Path) -> PathBuf {
    common::llama3_checkpoint(dir)
}

fn train(args: &[&str]) -> Output {
    common::train(&common::FINETUNE, args)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

const ALPACA: &str = r#"[
 {"instruction": "Name a colour.", "input": "", "output": "Blue."},
 {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
 {"instruction": "Translate to French: the cat", "output": "le chat"}
]"#;

const SHAREGPT: &str = r#"{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}
{"conversations": [{"from": "human", "value": "Zürich or 東京?"}, {"from": "gpt", "value": "Both."}, {"from": "human", "value": "Why?"}, {"from": "gpt", "value": "Because."}]}
"#;

const CHAT: &str = r#"{"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}]}
{"messages": [{"role": "system", "content": "You count."}, {"role": "user", "content": "One?"}, {"role": "assistant", "content": "Two."}]}
"#;

#[test]
fn every_instruction_format_trains_with_the_checkpoints_template() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    for (name, text) in [
        ("alpaca.json", ALPACA),
        ("sharegpt.jsonl", SHAREGPT),
        ("chat.jsonl", CHAT),
    ] {
        let data = write(dir.path(), name, text);
        // Windows as long as the model's context: every reply fits.
        let out = train(&[
            "--init-from",
            s(&ckpt),
            "--data",
            s(&data),
            "--seq-len",
            "64",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
        let format = name.split('.').next().unwrap();
        assert!(err.contains(&format!("{format} data: ")), "{name}: {err}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("NaN"), "{stdout}");
    }
}

/// The log counts truncated examples; --no-packing gives each example a
/// window of its own; --train-on-prompt trains on more targets.
#[test]
fn truncation_packing_and_prompt_training_show_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let long = format!(
        "{{\"instruction\": \"{}\", \"output\": \"ok\"}}\n{{\"instruction\": \"short\", \"output\": \"fine\"}}\n",
        "many words ".repeat(40)
    );
    let data = write(dir.path(), "long.jsonl", &long);
    let log = |extra: &[&str]| {
        let out = train(&[&["--init-from", s(&ckpt), "--data", s(&data)][..], extra].concat());
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err.lines()
            .find(|l| l.starts_with("alpaca data: "))
            .unwrap()
            .to_string()
    };
    // The long example's reply falls past the window: its window trains on
    // nothing and is dropped.
    let packed = log(&[]);
    assert!(packed.contains("2 examples"), "{packed}");
    assert!(packed.contains("1 truncated to --seq-len"), "{packed}");
    assert!(
        packed.contains("1 windows (packed, each example attending only to itself)"),
        "{packed}"
    );
    let trained = |line: &str| -> usize {
        let before = line.split(" targets trained on").next().unwrap();
        before.rsplit(", ").next().unwrap().parse().unwrap()
    };
    let unpacked = log(&["--no-packing"]);
    assert!(unpacked.contains("1 windows,"), "{unpacked}");
    let all = log(&["--train-on-prompt", "--no-packing"]);
    assert!(all.contains("2 windows,"), "{all}");
    let all = log(&["--train-on-prompt"]);
    assert!(trained(&all) > trained(&packed), "{all} vs {packed}");
}

/// Each bad input: one `error:` line naming what is wrong, a non-zero exit,
/// and neither the checkpoint folder nor the metrics file created.
fn refused(args: &[&str], expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (ck, m) = (dir.path().join("ck"), dir.path().join("m.jsonl"));
    let out = train(&[args, &["--checkpoint-dir", s(&ck), "--metrics", s(&m)]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(expected),
        "want `{expected}` in {}",
        lines[0]
    );
    assert!(
        !ck.exists() && !m.exists(),
        "{args:?}: something was written"
    );
}

#[test]
fn bad_checkpoints_tokenizers_templates_and_data_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let data = write(dir.path(), "chat.jsonl", CHAT);
    let with = |edit: &dyn Fn(&Path)| -> PathBuf {
        let copy = dir.path().join(format!("edited-{}", rand_name()));
        std::fs::create_dir_all(&copy).unwrap();
        for entry in std::fs::read_dir(&ckpt).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
        }
        edit(&copy);
        copy
    };
    let edit_json = |file: &'static str, f: fn(&mut serde_json::Value)| {
        move |dir: &Path| {
            let path = dir.join(file);
            let mut v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            f(&mut v);
            std::fs::write(path, v.to_string()).unwrap();
        }
    };

    let bert = with(&edit_json("config.json", |c| {
        c["model_type"] = "bert".into()
    }));
    refused(
        &["--init-from", s(&bert), "--data", s(&data)],
        "unsupported architecture `bert` (supported: llama, mistral, qwen2, qwen3, gpt2)",
    );
    let yarn = with(&edit_json("config.json", |c| {
        c["rope_parameters"]["rope_type"] = "yarn".into()
    }));
    refused(
        &["--init-from", s(&yarn), "--data", s(&data)],
        "rope scaling `yarn` (supported: default, linear, llama3)",
    );
    let broken = with(&|d: &Path| std::fs::write(d.join("tokenizer.json"), "{\"model\":").unwrap());
    refused(
        &["--init-from", s(&broken), "--data", s(&data)],
        "tokenizer.json` is not a usable tokenizer",
    );
    refused(
        &[
            "--init-from",
            s(&ckpt),
            "--tokenizer",
            s(&dir.path().join("none")),
            "--data",
            s(&data),
        ],
        "unknown tokenizer",
    );
    let small = with(&edit_json("config.json", |c| c["vocab_size"] = 300.into()));
    refused(
        &["--init-from", s(&small), "--data", s(&data)],
        "is smaller than",
    );
    let template = with(&edit_json("tokenizer_config.json", |c| {
        c["chat_template"] = "{{ raise_exception('roles must alternate') }}".into()
    }));
    refused(
        &["--init-from", s(&template), "--data", s(&data)],
        "(from --init-from) fails on",
    );
    let sharded = with(&|d: &Path| {
        std::fs::write(
            d.join("model.safetensors.index.json"),
            r#"{"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap()
    });
    refused(
        &["--init-from", s(&sharded), "--data", s(&data)],
        "model-00002-of-00002.safetensors",
    );
    let other = write(
        dir.path(),
        "other.jsonl",
        "{\"question\": \"?\", \"answer\": \"!\"}\n",
    );
    refused(
        &["--init-from", s(&ckpt), "--data", s(&other)],
        "is in none of the data formats",
    );
    let silent = write(
        dir.path(),
        "silent.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"anyone?\"}]}\n",
    );
    refused(
        &["--init-from", s(&ckpt), "--data", s(&silent)],
        "line 1: has no assistant turn",
    );
    refused(
        &[
            "--init-from",
            s(&ckpt),
            "--data",
            s(&data),
            "--data-format",
            "alpaca",
        ],
        "line 1: no string field `instruction`",
    );
    let text = write(dir.path(), "plain.txt", &"some plain text ".repeat(50));
    refused(
        &["--data", s(&text), "--train-on-prompt"],
        "apply to instruction data",
    );
}

fn rand_name() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst).to_string()
}

/// Short examples pack several to a window, with their boundaries: the
/// engine and `--resident` (plain burn on the whole model) see the same
/// first batch and agree on its loss, each through its own attention and
/// rotary path.
#[test]
fn packed_windows_train_alike_in_the_engine_and_resident() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let short: Vec<String> = ["Hi", "Go", "Up", "No", "Be", "Do"]
        .iter()
        .map(|w| format!("{{\"instruction\": \"{w}\", \"output\": \"{w}.\"}}"))
        .collect();
    let data = write(dir.path(), "short.jsonl", &short.join("\n"));
    let first_loss = |extra: &[&str]| {
        let metrics = dir.path().join(format!("m{}.jsonl", extra.len()));
        let args = [
            "--init-from",
            s(&ckpt),
            "--data",
            s(&data),
            "--seq-len",
            "64",
            "--metrics",
            s(&metrics),
        ];
        let out = train(&[&args[..], extra].concat());
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("alpaca data: "))
            .unwrap();
        // 6 examples of about 24 tokens, two to a window of 65.
        assert!(line.contains("6 examples"), "{line}");
        assert!(
            line.contains(" 3 windows"),
            "examples share windows: {line}"
        );
        common::metrics(&metrics)[0]["loss"].as_f64().unwrap()
    };
    let (engine, resident) = (first_loss(&[]), first_loss(&["--resident"]));
    assert!(
        ((engine - resident) / resident).abs() < 1e-4,
        "engine {engine}, resident {resident}"
    );
}
