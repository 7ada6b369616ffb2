//! The README is a user's guide whose commands work: every command in its
//! fenced shell blocks is either run here or run by a script (issue 51).
//!
//! - `cargo run [--release] --bin train [-- ARGS]` (the CPU build) runs here
//!   as this package's `train` with ARGS, in a scratch folder where the
//!   README's model folders (`--init-from`) are a tiny Llama 3-style
//!   checkpoint (the llama3 family fixture and its tokenizer) and its data
//!   files (`--data`) a few chat records. Runs that train take a few tiny
//!   steps ([`SMALL`] is appended) and must write what the README says they
//!   write (a `--resume` run: what its checkpoint folder's `config.toml`
//!   names); `--plan` and `--help` run as written. A fenced `toml` block
//!   whose first line is `# NAME` is written to NAME there first (the
//!   README's `--config` files).
//! - `cargo run [--release] --bin chat [-- ARGS]` runs as this package's
//!   `chat`, after every `train` command (so the folders they write exist),
//!   with a few new tokens a reply and, without `--prompt`, a turn on stdin.
//! - Every other command (`--features cuda`, several GPUs, Python) must
//!   appear verbatim, as a whole command line, in a script under `bench/`
//!   (not `bench/results/`, which records what was run once) or in `.ci/run`
//!   (CI runs the README's `cargo test --workspace` from there).
//!
//! The test fails naming any command that is neither. It also holds the
//! README to its shape: at most 300 lines, no run or call numbers (those
//! live in bench/README.md), and every relative link resolving, anchors
//! into bench/README.md included.
//!
//! A command's words are compared after shell-style splitting: `\`
//! continuations are joined, quotes removed, `# comments` dropped, and in a
//! block where any line starts with `$ `, only those lines are commands (the
//! rest is output).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Appended to every README run that trains: two steps of two 64-token
/// windows, one micro-batch, one sampled token (a later flag overrides the
/// README's).
const SMALL: [&str; 10] = [
    "--steps",
    "2",
    "--batch",
    "2",
    "--seq-len",
    "64",
    "--accum",
    "1",
    "--sample-tokens",
    "1",
];

/// The workspace root: the first folder above this crate whose Cargo.toml
/// declares `[workspace]` (the crate may live in `trainer/` or
/// `examples/train/`).
fn workspace_root() -> PathBuf {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    loop {
        let manifest = dir.join("Cargo.toml");
        if std::fs::read_to_string(&manifest).is_ok_and(|t| t.contains("[workspace]")) {
            return dir;
        }
        assert!(dir.pop(), "no workspace Cargo.toml above this crate");
    }
}

/// A command of the README: its words and the line it starts on.
#[derive(Debug)]
struct Cmd {
    words: Vec<String>,
    line: usize,
}

impl Cmd {
    fn text(&self) -> String {
        self.words.join(" ")
    }
}

/// The README's fenced `toml` blocks that start with `# NAME`: each file's
/// name and text.
fn readme_files(readme: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```toml" {
            continue;
        }
        let block: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        if let Some(name) = block.first().and_then(|l| l.strip_prefix("# ")) {
            files.push((name.trim().to_string(), block.join("\n") + "\n"));
        }
    }
    files
}

/// `args` after the output and evaluation flags that the `config.toml` of
/// its `--resume` folder names (in the folder or the one above), as the run takes them.
fn with_saved(scratch: &Scratch, args: &[String]) -> Vec<String> {
    let Some(resume) = value(args, "--resume").map(|r| scratch.path(r)) else {
        return args.to_vec();
    };
    let saved = [resume.join("config.toml"), resume.join("../config.toml")]
        .into_iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .unwrap_or_else(|| panic!("no config.toml beside {}", resume.display()));
    let saved: toml::Table = toml::from_str(&saved).unwrap();
    let mut all = Vec::new();
    for key in [
        "checkpoint-dir",
        "metrics",
        "export-hf",
        "eval-data",
        "eval-split",
    ] {
        if let Some(value) = saved.get(key) {
            let value = value.as_str().map_or(value.to_string(), str::to_string);
            all.extend([format!("--{key}"), value]);
        }
    }
    all.extend_from_slice(args);
    all
}

/// `args` with the keys of its `--config` file (one of the README's
/// `files`) that it does not give itself, as flags, as the run takes them.
fn with_config(files: &[(String, String)], args: &[String]) -> Vec<String> {
    let Some(name) = value(args, "--config") else {
        return args.to_vec();
    };
    let (_, text) = files
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("--config {name}: no such toml block in the README"));
    let table: toml::Table = toml::from_str(text).unwrap();
    let mut all = args.to_vec();
    for (key, value) in table {
        let flag = format!("--{key}");
        if has(args, &flag) {
            continue;
        }
        match value {
            toml::Value::Boolean(true) => all.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::String(text) => all.extend([flag, text]),
            toml::Value::Array(items) => {
                let items: Vec<String> = items.iter().map(|v| v.to_string()).collect();
                all.extend([flag, items.join(",")]);
            }
            other => all.extend([flag, other.to_string()]),
        }
    }
    all
}

/// Splits one logical shell line into words: quotes removed, backslash
/// escapes taken, an unquoted `#` at the start of a word ending the line.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                words.extend(word.take());
            }
            '#' if word.is_none() => break,
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    w.push(c);
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' if matches!(chars.peek(), Some('"' | '\\' | '$' | '`')) => {
                            w.push(chars.next().unwrap())
                        }
                        c => w.push(c),
                    }
                }
            }
            '\\' => {
                if let Some(c) = chars.next() {
                    word.get_or_insert_with(String::new).push(c);
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// Joins `\` continuations: the logical lines of `lines`, each with the
/// (1-based) number of its first line.
fn logical_lines<'a>(lines: impl Iterator<Item = (usize, &'a str)>) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (number, line) in lines {
        let trimmed = line.trim_end();
        let (body, continues) = match trimmed.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (trimmed, false),
        };
        let entry = pending.get_or_insert_with(|| (number, String::new()));
        entry.1.push_str(body);
        entry.1.push(' ');
        if !continues {
            out.extend(pending.take());
        }
    }
    out.extend(pending);
    out
}

/// The commands of the README's fenced shell blocks.
fn readme_commands(readme: &str) -> Vec<Cmd> {
    const SHELL: [&str; 5] = ["sh", "bash", "shell", "console", "zsh"];
    let lines: Vec<&str> = readme.lines().collect();
    let mut commands = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i + 1;
        let mut end = start;
        while end < lines.len() && !lines[end].trim_start().starts_with("```") {
            end += 1;
        }
        if SHELL.contains(&info.trim()) {
            let block: Vec<(usize, &str)> = (start..end).map(|n| (n + 1, lines[n])).collect();
            let prompted = block.iter().any(|(_, l)| l.trim_start().starts_with("$ "));
            // In a block with prompts only the prompted lines (and their
            // continuations) are commands.
            let mut kept = Vec::new();
            let mut continuing = false;
            for (number, line) in block {
                let stripped = line.trim_start();
                if prompted && !continuing {
                    match stripped.strip_prefix("$ ") {
                        Some(rest) => kept.push((number, rest)),
                        None => continue,
                    }
                } else {
                    kept.push((number, line));
                }
                continuing = line.trim_end().ends_with('\\');
            }
            for (line, text) in logical_lines(kept.into_iter()) {
                let words = shell_words(&text);
                if !words.is_empty() {
                    commands.push(Cmd { words, line });
                }
            }
        }
        i = end + 1;
    }
    commands
}

/// Every logical command line of the scripts under `bench/` (outside
/// `bench/results/`) and of `.ci/run`, as words.
fn script_commands(root: &Path) -> BTreeSet<Vec<String>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "results") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "sh") {
                out.push(path);
            }
        }
    }
    let mut scripts = Vec::new();
    walk(&root.join("bench"), &mut scripts);
    scripts.push(root.join(".ci/run"));
    let mut commands = BTreeSet::new();
    for script in scripts {
        let text = std::fs::read_to_string(&script).unwrap();
        for (_, line) in logical_lines(text.lines().enumerate()) {
            let words = shell_words(&line);
            if !words.is_empty() {
                commands.insert(words);
            }
        }
    }
    commands
}

/// The arguments for `train` when `words` is `cargo run [--release] --bin
/// train [-- ARGS]` on the default (CPU) build; `None` for anything else.
fn train_args(words: &[String]) -> Option<Vec<String>> {
    run_args(words, "train")
}

/// The arguments for `program` when `words` is `cargo run [--release]
/// --bin PROGRAM [-- ARGS]` on the default (CPU) build; `None` otherwise.
fn run_args(words: &[String], program: &str) -> Option<Vec<String>> {
    let mut rest = words.strip_prefix(&["cargo".to_string(), "run".to_string()])?;
    let mut bin = false;
    while let Some((first, tail)) = rest.split_first() {
        match first.as_str() {
            "--release" => rest = tail,
            "--bin" if tail.first().is_some_and(|b| b == program) => {
                bin = true;
                rest = &tail[1..];
            }
            "--" => {
                rest = tail;
                break;
            }
            _ => return None, // --features, -p, …: not the CPU build's train
        }
    }
    bin.then(|| rest.to_vec())
}

/// The value after `flag` in `args`, if any (the last one wins, as in `train`).
fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.windows(2)
        .rev()
        .find(|w| w[0] == flag)
        .map(|w| w[1].as_str())
}

fn has(args: &[String], flag: &str) -> bool {
    args.iter().any(|a| a == flag)
}

/// A scratch folder holding what the README's runs read: each `--init-from`
/// folder a tiny Llama 3-style checkpoint, each `--data` file chat records
/// (a `--data` folder a dataset of one Parquet shard of them).
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new(root: &Path, commands: &[Vec<String>]) -> Self {
        let scratch = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        let fixture = root.join("tests/fixtures/families/llama3");
        for args in commands {
            if let Some(model) = value(args, "--init-from") {
                let out = scratch.path(model);
                std::fs::create_dir_all(&out).unwrap();
                for entry in std::fs::read_dir(&fixture).unwrap() {
                    let entry = entry.unwrap();
                    std::fs::copy(entry.path(), out.join(entry.file_name())).unwrap();
                }
                // The fixture's context is 64 positions; the README's
                // --plan asks about the real model's lengths.
                let config = out.join("config.json");
                let mut json: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
                json["max_position_embeddings"] = 131072.into();
                std::fs::write(&config, json.to_string()).unwrap();
            }
            if let Some(data) = value(args, "--data") {
                let out = scratch.path(data);
                if Path::new(data).extension().is_none() {
                    // A Hugging Face dataset's folder: its Parquet shard of
                    // chat records.
                    let shard = out.join("data/train-00000-of-00001.parquet");
                    std::fs::create_dir_all(shard.parent().unwrap()).unwrap();
                    std::fs::copy(root.join("tests/fixtures/parquet/chat.parquet"), shard).unwrap();
                    continue;
                }
                std::fs::create_dir_all(out.parent().unwrap()).unwrap();
                let records: Vec<String> = (0..24)
                    .map(|i| {
                        let (a, b) = (i % 6, i / 6);
                        serde_json::json!({"messages": [
                            {"role": "user", "content": format!("What is {a} plus {b}?")},
                            {"role": "assistant", "content": format!("{a} plus {b} is {}.", a + b)},
                        ]})
                        .to_string()
                    })
                    .collect();
                std::fs::write(out, records.join("\n") + "\n").unwrap();
            }
        }
        scratch
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    fn train(&self, args: &[String], extra: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_train"))
            .args(args)
            .args(extra)
            .current_dir(self.dir.path())
            // The token cache of text corpora, kept out of the user's home.
            .env("XDG_CACHE_HOME", self.path("cache"))
            .output()
            .expect("train runs")
    }

    /// `chat` with `args` and a few new tokens, a turn on stdin.
    fn chat(&self, args: &[String]) -> Output {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_chat"))
            .args(args)
            .args(["--max-new-tokens", "4"])
            .current_dir(self.dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("chat runs");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"What is 2 plus 3?\n").unwrap();
        drop(stdin);
        child.wait_with_output().unwrap()
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Checks that a training run wrote what the README says it writes.
/// A run stopped before its end (`stopped`) has not evaluated yet.
fn check_outputs(scratch: &Scratch, args: &[String], out: &Output, what: &str, stopped: bool) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Some(dir) = value(args, "--checkpoint-dir") {
        let dir = scratch.path(dir);
        let steps: Vec<String> = files_in(&dir)
            .into_iter()
            .filter(|n| n.starts_with("step-"))
            .collect();
        let newest = steps
            .last()
            .unwrap_or_else(|| panic!("{what}: no step-<N> folder in {}", dir.display()));
        let files = files_in(&dir.join(newest));
        for file in [
            "manifest.json",
            "model.safetensors",
            "optimizer.safetensors",
        ] {
            assert!(
                files.iter().any(|f| f == file),
                "{what}: {newest} lacks {file}: {files:?}"
            );
        }
    }
    if let Some(metrics) = value(args, "--metrics") {
        let text = std::fs::read_to_string(scratch.path(metrics))
            .unwrap_or_else(|e| panic!("{what}: --metrics {metrics}: {e}"));
        assert!(
            text.lines().any(|l| l.contains("\"step\"")),
            "{what}: no step in {metrics}"
        );
        if !stopped && (has(args, "--eval-data") || has(args, "--eval-split")) {
            assert!(
                text.contains("\"eval_loss\""),
                "{what}: no evaluation in {metrics}"
            );
        }
        if has(args, "--resume") {
            assert!(
                text.contains("resumed_from"),
                "{what}: the resume left no mark in {metrics}"
            );
        }
    }
    if let Some(export) = value(args, "--export-hf") {
        let files = files_in(&scratch.path(export));
        for file in ["config.json", "model.safetensors", "tokenizer.json"] {
            assert!(
                files.iter().any(|f| f == file),
                "{what}: the export {export} lacks {file}: {files:?}"
            );
        }
    }
    let outputs = ["--checkpoint-dir", "--metrics", "--export-hf"];
    if !outputs.iter().any(|f| has(args, f)) {
        assert!(
            stdout.contains("--- sample ---"),
            "{what}: no sample:\n{stdout}"
        );
    }
}

#[test]
fn every_readme_command_is_run_here_or_by_a_script() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let commands = readme_commands(&readme);
    assert!(!commands.is_empty(), "no commands in the README");
    let scripts = script_commands(&root);

    let runnable: Vec<(usize, Vec<String>)> = commands
        .iter()
        .enumerate()
        .filter_map(|(i, c)| train_args(&c.words).map(|args| (i, args)))
        .collect();
    let files = readme_files(&readme);
    // What each run reads and writes, its `--config` file's keys included.
    let all_args: Vec<Vec<String>> = runnable
        .iter()
        .map(|(_, a)| with_config(&files, a))
        .collect();
    let scratch = Scratch::new(&root, &all_args);
    for (name, text) in &files {
        std::fs::write(scratch.path(name), text).unwrap();
    }
    // Checkpoint folders a later command resumes: the run that fills one
    // stops after a step, and its export is removed, as a run stopped by a
    // signal leaves none (the resume then finishes it and exports).
    let resumed: BTreeSet<&str> = all_args
        .iter()
        .filter_map(|a| value(a, "--resume"))
        .collect();

    let mut neither = Vec::new();
    let mut chats = Vec::new();
    for (i, cmd) in commands.iter().enumerate() {
        let what = format!("README line {}: `{}`", cmd.line, cmd.text());
        if let Some(args) = run_args(&cmd.words, "chat") {
            chats.push((what, args));
            continue;
        }
        let Some((_, args)) = runnable.iter().find(|(j, _)| *j == i) else {
            if scripts.contains(&cmd.words) {
                eprintln!("in a script: {what}");
            } else {
                neither.push(what);
            }
            continue;
        };
        let informational = ["--plan", "--help", "-h", "--version", "-V"];
        if informational.iter().any(|f| has(args, f)) {
            let out = scratch.train(args, &[]);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{what} failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let expected = if has(args, "--plan") {
                "bytes/param"
            } else {
                "Usage: train"
            };
            assert!(
                stdout.contains(expected),
                "{what}: no `{expected}`:\n{stdout}"
            );
            eprintln!("ran: {what}");
            continue;
        }
        let configured = with_config(&files, args);
        let stopped = value(&configured, "--checkpoint-dir").is_some_and(|d| resumed.contains(d))
            && !has(args, "--resume");
        let extra: Vec<&str> = SMALL
            .iter()
            .copied()
            .chain(
                stopped
                    .then_some(["--stop-after", "1"])
                    .into_iter()
                    .flatten(),
            )
            .collect();
        let out = scratch.train(args, &extra);
        assert!(
            out.status.success(),
            "{what} failed (with {extra:?}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        check_outputs(
            &scratch,
            &with_saved(&scratch, &configured),
            &out,
            &what,
            stopped,
        );
        if stopped {
            if let Some(export) = value(&configured, "--export-hf") {
                std::fs::remove_dir_all(scratch.path(export)).unwrap();
            }
        }
        eprintln!("ran (with {extra:?}): {what}");
    }
    // Chats talk with what the trainings wrote.
    assert!(!chats.is_empty(), "the README shows no chat");
    for (what, args) in chats {
        let out = scratch.chat(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what} failed:\n{stderr}");
        assert!(stderr.contains("key/value cache"), "{what}:\n{stderr}");
        eprintln!("ran (with --max-new-tokens 4): {what}");
    }
    assert!(
        neither.is_empty(),
        "README commands neither run by this test (`cargo run --release --bin train -- …`) \
         nor found verbatim in a script under bench/ or in .ci/run:\n{}",
        neither.join("\n")
    );
}

#[test]
fn the_readme_is_a_guide_of_at_most_300_lines_without_run_numbers() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines; at most 300");
    for (number, line) in readme.lines().enumerate() {
        assert!(
            !names_a_run_or_call(line),
            "README line {}: run and call numbers belong in bench/README.md: {line}",
            number + 1
        );
    }
}

/// Whether `line` names a run or a call by number (`run39`, `call 6`,
/// `calls 5–6`), as the measurement history does.
fn names_a_run_or_call(line: &str) -> bool {
    let lower = line.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let is_number = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit());
    words.iter().enumerate().any(|(i, word)| {
        ["run", "call", "calls"].iter().any(|name| {
            word.strip_prefix(name).is_some_and(is_number)
                || (word == name && words.get(i + 1).is_some_and(|n| is_number(n)))
        })
    })
}

/// The headings of a markdown file as GitHub makes their anchors.
fn anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn the_readmes_relative_links_resolve() {
    let root = workspace_root();
    for file in ["README.md", "bench/README.md"] {
        let path = root.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let base = path.parent().unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let target = &rest[..rest.find(')').unwrap()];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file_part, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target, None),
            };
            let linked = if file_part.is_empty() {
                path.clone()
            } else {
                base.join(file_part)
            };
            assert!(
                linked.exists(),
                "{file}: link to `{target}`, which does not exist"
            );
            if let Some(anchor) = anchor {
                let headings = anchors(&std::fs::read_to_string(&linked).unwrap());
                assert!(
                    headings.contains(anchor),
                    "{file}: link to `{target}`, but no heading makes `#{anchor}` \
                     (headings: {headings:?})"
                );
            }
        }
    }
}

#[test]
fn the_parser_reads_continuations_comments_quotes_and_prompts() {
    let readme = "text\n```sh\ncargo run --release --bin train -- --a 1 \\\n    --b \"two words\"  # note\n# a comment\n\n```\n```console\n$ echo 'x y'\noutput line\n```\n```rust\nlet x = 1;\n```\n";
    let commands = readme_commands(readme);
    let words: Vec<Vec<String>> = commands.iter().map(|c| c.words.clone()).collect();
    let expected: Vec<Vec<String>> = vec![
        vec![
            "cargo",
            "run",
            "--release",
            "--bin",
            "train",
            "--",
            "--a",
            "1",
            "--b",
            "two words",
        ],
        vec!["echo", "x y"],
    ]
    .into_iter()
    .map(|c| c.into_iter().map(String::from).collect())
    .collect();
    assert_eq!(words, expected);
    assert_eq!(commands[0].line, 3);
    assert_eq!(
        train_args(&commands[0].words).unwrap(),
        ["--a", "1", "--b", "two words"]
    );
    let cuda: Vec<String> = "cargo run --release --features cuda --bin train -- --gpus 2"
        .split(' ')
        .map(String::from)
        .collect();
    assert_eq!(train_args(&cuda), None);
    for named in ["run39 call 6", "(Run 12)", "calls 5-6", "call3/"] {
        assert!(names_a_run_or_call(named), "{named}");
    }
    for plain in ["run the same command", "a call of train", "running 2 GPUs"] {
        assert!(!names_a_run_or_call(plain), "{plain}");
    }
    let scripts = script_commands(&workspace_root());
    let words = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
    assert!(scripts.contains(&words("cargo test --workspace")));
    assert!(!scripts.contains(&words("cargo run --release --features cuda --bin nothing")));
}
