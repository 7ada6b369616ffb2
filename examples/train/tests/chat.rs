//! The `chat` program, run as a user runs it: on a Hugging Face folder and
//! on a checkpoint of `train`, with the key/value cache, without it and
//! streamed; with a seed; interactively; on folders it cannot use; and the
//! chat templates it renders against transformers'.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{error_lines, fixtures};

fn chat(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_chat"))
        .args(args)
        .output()
        .expect("chat runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The Llama 3-style fixture (random weights, the fixture tokenizer with
/// Llama 3's chat template) with a context of 256 positions.
fn llama3(dir: &Path) -> PathBuf {
    let out = common::llama3_checkpoint(dir);
    let config = out.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    json["max_position_embeddings"] = 256.into();
    std::fs::write(&config, json.to_string()).unwrap();
    out
}

/// Greedy, 64 tokens, with nothing that stops a reply early but the budget.
const GREEDY_64: [&str; 6] = [
    "--temperature",
    "0",
    "--max-new-tokens",
    "64",
    "--prompt",
    "Say something long.",
];

/// The reply and the count of tokens decoded after the first (stderr).
fn reply(out: &Output) -> (String, usize) {
    assert!(out.status.success(), "{}", stderr(out));
    let err = stderr(out);
    let decoded = err
        .split("decode: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no decode count: {err}"));
    (stdout(out), decoded)
}

/// Acceptance (issue 52): the same greedy reply of 64 tokens with the cache
/// (resident, and streamed from the engine's store as in training) as
/// without it (the whole conversation again for each token): a Hugging Face
/// folder of Llama 3's family, and a checkpoint of a GPT-2 that `train` wrote.
#[test]
fn the_cached_reply_is_the_recomputed_one() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama3(dir.path());
    let checkpoints = dir.path().join("gpt2");
    let out = common::train(
        &["--steps", "3", "--batch", "2", "--seq-len", "32"],
        &["--sample-tokens", "0", "--checkpoint-dir", s(&checkpoints)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    for (folder, raw) in [(&model, "--raw"), (&checkpoints, "--seed=1")] {
        let run = |how: &[&str]| chat(&[&[s(folder), raw][..], how, &GREEDY_64].concat());
        let cached = run(&[]);
        assert!(
            stderr(&cached).contains("with a key/value cache"),
            "{}",
            stderr(&cached)
        );
        let (text, decoded) = reply(&cached);
        assert_eq!(decoded, 63, "{}", stderr(&cached));
        let recomputed = run(&["--no-cache"]);
        assert!(
            stderr(&recomputed).contains("without a cache"),
            "{}",
            stderr(&recomputed)
        );
        assert_eq!(reply(&recomputed), (text.clone(), 63), "{folder:?}");
        let streamed = run(&["--streamed"]);
        assert!(
            stderr(&streamed).contains("streamed (--streamed)"),
            "{}",
            stderr(&streamed)
        );
        assert_eq!(reply(&streamed), (text, 63), "{folder:?}");
    }
    // A checkpoint of `train` streamed with adapters (a Hugging Face folder
    // merges them as it is read): one line, no reply.
    let adapter = dir.path().join("adapter");
    std::fs::create_dir(&adapter).unwrap();
    std::fs::write(
        adapter.join("adapter_config.json"),
        r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]}"#,
    )
    .unwrap();
    let out = chat(&[s(&checkpoints), "--adapter", s(&adapter), "--streamed"]);
    assert!(!out.status.success());
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("takes no adapters yet"), "{}", errors[0]);
    assert!(out.stdout.is_empty());
}

/// Sampling with top-k, top-p, a temperature and a repetition penalty
/// draws the same reply from the same seed, and another from another.
#[test]
fn sampling_is_reproducible_with_a_seed() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama3(dir.path());
    let sampled = |seed: &str| {
        let args = [
            s(&model),
            "--prompt",
            "Tell me a story.",
            "--max-new-tokens",
            "48",
            "--temperature",
            "1.2",
            "--top-k",
            "500",
            "--top-p",
            "0.95",
            "--repetition-penalty",
            "1.1",
            "--seed",
            seed,
        ];
        let out = chat(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let first = sampled("7");
    assert_eq!(first, sampled("7"));
    assert_ne!(first, sampled("8"));
}

/// Each stdin line is a turn of one conversation; `/reset` starts another.
#[test]
fn interactive_turns_come_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama3(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_chat"))
        .args([s(&model), "--max-new-tokens", "5", "--temperature", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Hello\nAnd then?\n/reset\nHello\n/quit\nnever read\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let replies: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    // Three replies (a reply may hold line breaks of its own): after
    // `/reset` the first turn's reply again.
    let text = stdout(&out);
    assert!(replies.len() >= 3, "{text}");
    let first = chat(&[
        s(&model),
        "--max-new-tokens",
        "5",
        "--temperature",
        "0",
        "--prompt",
        "Hello",
    ]);
    let once = stdout(&first);
    assert!(text.starts_with(&once), "{text:?} vs {once:?}");
    assert!(text.ends_with(&once), "{text:?} vs {once:?}");
}

/// Files under `dir` with their sizes and modification times.
fn listing(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            (e.path(), meta.len(), meta.modified().unwrap())
        })
        .collect();
    out.sort();
    out
}

/// Acceptance: a folder without a tokenizer is one `error:` line naming
/// what is missing, a non-zero exit, and nothing written; so is a
/// checkpoint trained with a tokenizer.json it does not keep.
#[test]
fn a_folder_without_a_tokenizer_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("mistral");
    std::fs::create_dir(&model).unwrap();
    for entry in std::fs::read_dir(fixtures().join("families/mistral")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
    }
    assert!(!model.join("tokenizer.json").exists());
    let before = listing(&model);
    let out = chat(&[s(&model), "--prompt", "Hi"]);
    assert!(!out.status.success());
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{}", stderr(&out));
    assert!(errors[0].contains("has no tokenizer.json"), "{}", errors[0]);
    assert!(errors[0].contains("--tokenizer"), "{}", errors[0]);
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    assert_eq!(listing(&model), before);

    // A fine-tune's checkpoint names its tokenizer.json, which is not in it.
    let checkpoints = dir.path().join("runs");
    let source = common::llama3_checkpoint(dir.path());
    let out = common::train(
        &common::FINETUNE,
        &[
            "--init-from",
            s(&source),
            "--checkpoint-dir",
            s(&checkpoints),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let before = listing(&checkpoints);
    let out = chat(&[s(&checkpoints), "--prompt", "Hi"]);
    assert!(!out.status.success());
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{}", stderr(&out));
    assert!(
        errors[0].contains("give it with --tokenizer"),
        "{}",
        errors[0]
    );
    assert_eq!(listing(&checkpoints), before);
    // Given the tokenizer, the checkpoint talks.
    let out = chat(&[
        s(&checkpoints),
        "--tokenizer",
        s(&source),
        "--prompt",
        "Hi",
        "--max-new-tokens",
        "4",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Settings that cannot work are refused before anything is loaded.
#[test]
fn bad_settings_are_one_error_line() {
    for (args, says) in [
        (&["--temperature", "-1"][..], "--temperature must be"),
        (&["--top-p", "0"], "--top-p must be"),
        (
            &["--repetition-penalty", "0"],
            "--repetition-penalty must be",
        ),
        (&["--repeat", "2"], "--repeat"),
    ] {
        let out = chat(&[&[s(&fixtures().join("families/llama3"))][..], args].concat());
        assert!(!out.status.success(), "{args:?}");
        let errors = error_lines(&out);
        assert_eq!(errors.len(), 1, "{args:?}: {}", stderr(&out));
        assert!(errors[0].contains(says), "{args:?}: {}", errors[0]);
    }
}

/// Acceptance: the chat templates render as transformers renders them, with
/// the generation prompt and without, to the same text and the same ids
/// (tests/fixtures/chat_templates.json, written by chat_templates.py
/// beside it with transformers).
#[test]
fn chat_templates_render_as_transformers_does() {
    use trainer::chat::{ChatTemplate, Message, PLAIN_TEMPLATE};
    use trainer::tokenizer::Tokenizer;
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("chat_templates.json")).unwrap(),
    )
    .unwrap();
    let tokenizer = Tokenizer::from_name(s(&fixtures().join("tokenizer"))).unwrap();
    let templates = fixture["templates"].as_object().unwrap();
    assert_eq!(
        templates["plain"], PLAIN_TEMPLATE,
        "the plain template changed"
    );
    assert_eq!(
        templates["llama3"],
        tokenizer.chat_template().unwrap(),
        "the fixture tokenizer's template changed"
    );
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    let mut generation_prompts = 0;
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let template = ChatTemplate::new(templates[name].as_str(), &tokenizer.specials()).unwrap();
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let generation = case["add_generation_prompt"].as_bool().unwrap();
        generation_prompts += generation as usize;
        let text = template.render(&messages, generation).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap(), "{name}: {messages:?}");
        let ids: Vec<u64> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap())
            .collect();
        let ours: Vec<u64> = tokenizer.encode(&text).iter().map(|&i| i as u64).collect();
        assert_eq!(ours, ids, "{name}: {messages:?}");
    }
    assert!(generation_prompts * 2 == cases.len());
}

/// The sample after training is generated as `chat` generates: after
/// instruction data, it answers the first example's prompt (rendered with
/// the generation prompt); with `--sample-tokens 0` nothing is printed.
#[test]
fn the_sample_after_training_answers_the_datas_first_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::llama3_checkpoint(dir.path());
    let data = dir.path().join("chat.jsonl");
    let records = [
        r#"{"messages": [{"role": "user", "content": "What is 1 plus 2?"}, {"role": "assistant", "content": "3."}]}"#,
        r#"{"messages": [{"role": "user", "content": "What is 2 plus 2?"}, {"role": "assistant", "content": "4."}]}"#,
    ];
    std::fs::write(&data, records.join("\n")).unwrap();
    let run = |tokens: &str| {
        let args = [
            "--init-from",
            s(&model),
            "--data",
            s(&data),
            "--sample-tokens",
            tokens,
        ];
        let out = common::train(&common::FINETUNE, &args);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let text = run("3");
    let sample = text.split("--- sample ---\n").nth(1).expect("a sample");
    let prompt = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 1 plus 2?\
                  <|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    assert!(sample.starts_with(prompt), "{sample:?}");
    assert!(!run("0").contains("--- sample ---"));
}
