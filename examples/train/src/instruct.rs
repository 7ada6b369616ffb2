//! Instruction data: alpaca (`instruction`/`input`/`output`), sharegpt
//! (`conversations` of `from`/`value`) and chat (`messages` of
//! `role`/`content`) records, in JSON Lines, a JSON array or Parquet rows
//! (the same fields as columns), rendered with the
//! tokenizer's chat template ([`crate::chat`]) and tokenized in parallel into
//! training windows whose targets cover the assistant's tokens only (all of
//! them with `train_on_prompt`).
//!
//! Examples are packed greedily into windows of `seq_len + 1` tokens (each
//! ending with the end-of-sequence token where the tokenizer has one), or one
//! per window without packing; the rest of a window is padding that is not
//! trained on. An example longer than a window is truncated and counted.
//! A packed window keeps where each example (and the padding) starts: no
//! example attends to another, positions restart at each one, and no
//! example's last token is trained to predict the next one's first, so a
//! packed example trains exactly as it would alone in its window.

use std::fmt;
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};

use burn_offload::ops::cross_entropy::IGNORE_INDEX;
use rayon::prelude::*;
use serde_json::Value;

use crate::chat::{ChatError, ChatTemplate, Message};
use crate::data::parquet::{self, ParquetError};
use crate::data::{collect_files, corpus_files, is_parquet, trained_targets, DataError, Windows};
use crate::tokenizer::Tokenizer;

/// What `--data` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DataFormat {
    /// Decided from the files: `.txt`, or the first record's fields (a
    /// Parquet file's columns).
    Auto,
    /// Plain text (`.txt`, or `.jsonl` with a `text` field).
    Text,
    /// `{"instruction", "input", "output"}` records.
    Alpaca,
    /// `{"conversations": [{"from", "value"}]}` records.
    Sharegpt,
    /// `{"messages": [{"role", "content"}]}` records.
    Chat,
}

impl fmt::Display for DataFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            DataFormat::Auto => "auto",
            DataFormat::Text => "text",
            DataFormat::Alpaca => "alpaca",
            DataFormat::Sharegpt => "sharegpt",
            DataFormat::Chat => "chat",
        };
        f.write_str(name)
    }
}

/// Why instruction data could not be used.
#[derive(Debug, thiserror::Error)]
pub enum InstructError {
    #[error("`{}` does not exist", .0.display())]
    NotFound(PathBuf),
    #[error("cannot read `{}`: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("`{}` {at}: invalid JSON: {error}", path.display())]
    Json {
        path: PathBuf,
        at: String,
        error: serde_json::Error,
    },
    #[error(
        "`{}` is in none of the data formats: expected text (.txt, or records with `text`), \
         alpaca (`instruction`/`output`), sharegpt (`conversations`) or chat (`messages`) records",
        .0.display()
    )]
    UnknownFormat(PathBuf),
    #[error("`{}` holds no records", .0.display())]
    Empty(PathBuf),
    #[error("{0}")]
    Parquet(ParquetError),
    #[error("{0}")]
    Data(DataError),
    #[error("`{}` {at}: {reason}", path.display())]
    Record {
        path: PathBuf,
        at: String,
        reason: String,
    },
    #[error("{}", chat_message(template, path, at, error))]
    Chat {
        /// Which template: its file and the flag that named it.
        template: String,
        path: PathBuf,
        at: String,
        error: ChatError,
    },
    #[error(
        "--seq-len {seq_len} leaves no token to train on in {} (the longest, {at}, has \
         {longest} tokens); raise --seq-len",
        if *emptied == *examples { format!("any of the {examples} examples") }
        else { format!("{emptied} of the {examples} examples") }
    )]
    CutBeforeTraining {
        seq_len: usize,
        emptied: usize,
        examples: usize,
        longest: usize,
        at: String,
    },
}

// Not `#[from]`: that would make them `source`s too, and error-chain
// printers would repeat them.
impl From<ParquetError> for InstructError {
    fn from(error: ParquetError) -> Self {
        InstructError::Parquet(error)
    }
}

impl From<DataError> for InstructError {
    fn from(error: DataError) -> Self {
        InstructError::Data(error)
    }
}

/// One line: the template, the record it failed on, and why.
fn chat_message(template: &str, path: &Path, at: &str, error: &ChatError) -> String {
    match error {
        ChatError::Compile(why) => format!("{template} does not compile: {why}"),
        ChatError::Render(why) => {
            format!("{template} fails on `{}` {at}: {why}", path.display())
        }
        ChatError::NotIncremental => format!(
            "{template} does not render `{}` {at} as the rendering of its first turns followed \
             by the next one, so the assistant's tokens cannot be told apart; use \
             --train-on-prompt",
            path.display()
        ),
    }
}

/// How examples become windows.
#[derive(Debug, Clone, Copy)]
pub struct Shaping {
    pub format: DataFormat,
    pub seq_len: usize,
    /// Train on every token, not only the assistant's.
    pub train_on_prompt: bool,
    /// Pack several examples into a window (else one each, padded).
    pub packing: bool,
}

/// Instruction data made into windows, with what happened on the way.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The windows with at least one trained target (the others would train
    /// on nothing).
    pub windows: Windows,
    pub format: DataFormat,
    pub examples: usize,
    /// Examples cut to the window length.
    pub truncated: usize,
    /// Examples that had tokens to train on and lost every one of them to
    /// the cut.
    pub emptied: usize,
    /// Windows dropped for holding no trained target.
    pub dropped_windows: usize,
    /// The example with the most tokens: how many, and where it is.
    pub longest: (usize, String),
    /// Tokens of all examples (before truncation).
    pub tokens: usize,
    /// Targets trained on, over all windows.
    pub trained: usize,
    /// Tokens tokenized per second.
    pub tokens_per_s: f64,
    /// The first example's turns before its last assistant turn, rendered
    /// with the generation prompt and tokenized: what the sample after
    /// training answers.
    pub sample_prompt: Vec<u32>,
}

impl Prepared {
    /// Refuses data that would train on nothing, or on less than half of its
    /// examples, because `--seq-len` cuts them before their first trained
    /// token.
    pub fn check_trains(&self) -> Result<(), InstructError> {
        if self.emptied * 2 > self.examples || self.windows.count() == 0 {
            return Err(InstructError::CutBeforeTraining {
                seq_len: self.windows.seq_len,
                emptied: self.emptied,
                examples: self.examples,
                longest: self.longest.0,
                at: self.longest.1.clone(),
            });
        }
        Ok(())
    }
}

/// One record, where it came from, and its JSON.
struct Record {
    path: PathBuf,
    at: String,
    value: Value,
}

/// The fields of a record that some format reads: the columns read from
/// Parquet files.
const RECORD_FIELDS: [&str; 7] = [
    "text",
    "instruction",
    "input",
    "output",
    "system",
    "conversations",
    "messages",
];

/// The columns that make a format, in words.
const ANY_FORMAT: &str =
    "`text`, `instruction` (alpaca), `conversations` (sharegpt) or `messages` (chat) column";

/// The format of the data at `path` when `Auto`: `.txt` (or a folder
/// without `.json`/`.jsonl`/`.parquet` files) is text; otherwise the first
/// record's fields (a Parquet file's columns) decide.
pub fn detect(path: &Path) -> Result<DataFormat, InstructError> {
    let files = record_files(path)?;
    let Some(first) = files.first() else {
        return Ok(DataFormat::Text);
    };
    if is_parquet(first) {
        let columns = parquet::columns(first)?;
        return match format_of(|k| columns.iter().any(|c| c == k)) {
            Some(format) => Ok(format),
            None => Err(ParquetError::NoColumn {
                path: first.clone(),
                wanted: ANY_FORMAT.into(),
                columns,
            }
            .into()),
        };
    }
    let records = read_records(first, Some(1))?;
    let Some(record) = records.first() else {
        return Err(InstructError::Empty(first.clone()));
    };
    format_of(|k| record.value.get(k).is_some())
        .ok_or_else(|| InstructError::UnknownFormat(first.clone()))
}

/// The format of a record with these fields (a JSON record's, or a Parquet
/// file's columns), the first that fits in this order.
fn format_of(has: impl Fn(&str) -> bool) -> Option<DataFormat> {
    [
        ("messages", DataFormat::Chat),
        ("conversations", DataFormat::Sharegpt),
        ("instruction", DataFormat::Alpaca),
        ("text", DataFormat::Text),
    ]
    .into_iter()
    .find_map(|(field, format)| has(field).then_some(format))
}

/// Checks, from their footers, that every Parquet file of the data at
/// `path` is one and has the columns `format` reads, so that a bad shard
/// is refused before a run starts rather than when its turn comes.
pub fn check_parquet(path: &Path, format: DataFormat) -> Result<(), InstructError> {
    let (files, needed): (Vec<PathBuf>, &[&str]) = match format {
        DataFormat::Auto | DataFormat::Text => (corpus_files(path)?, &["text"]),
        DataFormat::Alpaca => (record_files(path)?, &["instruction", "output"]),
        DataFormat::Sharegpt => (record_files(path)?, &["conversations"]),
        DataFormat::Chat => (record_files(path)?, &["messages"]),
    };
    for file in files.iter().filter(|f| is_parquet(f)) {
        let columns = parquet::columns(file)?;
        if let Some(missing) = needed.iter().find(|n| !columns.iter().any(|c| c == *n)) {
            let wanted = match format {
                DataFormat::Auto | DataFormat::Text => format!("`{missing}` column"),
                _ => format!("`{missing}` column, which {format} data needs"),
            };
            return Err(ParquetError::NoColumn {
                path: file.clone(),
                wanted,
                columns,
            }
            .into());
        }
    }
    Ok(())
}

/// Reads, renders and tokenizes the records at `path` into windows.
pub fn prepare(
    path: &Path,
    shaping: Shaping,
    tokenizer: &Tokenizer,
) -> Result<Prepared, InstructError> {
    let format = match shaping.format {
        DataFormat::Auto => detect(path)?,
        format => format,
    };
    let mut records = Vec::new();
    for file in record_files(path)? {
        records.extend(read_records(&file, None)?);
    }
    if records.is_empty() {
        return Err(InstructError::Empty(path.to_path_buf()));
    }
    let template =
        ChatTemplate::new(tokenizer.chat_template(), &tokenizer.specials()).map_err(|error| {
            InstructError::Chat {
                template: tokenizer.template_origin(),
                path: path.to_path_buf(),
                at: String::new(),
                error,
            }
        })?;
    let eos = tokenizer.specials().eos.map(|s| s.id);
    let started = std::time::Instant::now();
    // Every record is tried, and the first bad one in the files' order is
    // reported, whichever thread met it.
    let examples: Vec<Result<Example, InstructError>> = records
        .par_iter()
        .map(|record| {
            let messages = conversation(record, format)?;
            let (text, spans) = if shaping.train_on_prompt {
                let text = template.render(&messages, false);
                text.map(|t| {
                    let all = 0..t.len();
                    (t, vec![all])
                })
            } else {
                template.render_with_spans(&messages)
            }
            .map_err(|error| InstructError::Chat {
                template: tokenizer.template_origin(),
                path: record.path.clone(),
                at: record.at.clone(),
                error,
            })?;
            Ok(tokenize(tokenizer, &text, &spans, eos))
        })
        .collect();
    let examples: Vec<Example> = examples.into_iter().collect::<Result<_, _>>()?;
    let sample_prompt = sample_prompt(&records[0], format, &template, tokenizer)?;
    let tokens: usize = examples.iter().map(|(ids, _)| ids.len()).sum();
    let tokens_per_s = tokens as f64 / started.elapsed().as_secs_f64().max(1e-9);
    let pad = tokenizer.specials().pad.map(|s| s.id).or(eos).unwrap_or(0);
    let packed = pack(&examples, shaping.seq_len, shaping.packing, pad);
    let (windows, dropped_windows) = packed.windows.without_untrained();
    let trained = trained_targets(&windows.targets);
    let longest = examples
        .iter()
        .zip(&records)
        .max_by_key(|((ids, _), _)| ids.len())
        .map(|((ids, _), r)| (ids.len(), format!("`{}` {}", r.path.display(), r.at)))
        .unwrap_or_default();
    Ok(Prepared {
        windows,
        format,
        examples: examples.len(),
        truncated: packed.truncated,
        emptied: packed.emptied,
        dropped_windows,
        longest,
        tokens,
        trained,
        tokens_per_s,
        sample_prompt,
    })
}

/// `record`'s turns before its last assistant turn, rendered with the
/// generation prompt, as token ids.
fn sample_prompt(
    record: &Record,
    format: DataFormat,
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
) -> Result<Vec<u32>, InstructError> {
    let mut messages = conversation(record, format)?;
    if let Some(last) = messages.iter().rposition(|m| m.role == "assistant") {
        messages.truncate(last);
    }
    let text = template
        .render(&messages, true)
        .map_err(|error| InstructError::Chat {
            template: tokenizer.template_origin(),
            path: record.path.clone(),
            at: record.at.clone(),
            error,
        })?;
    Ok(tokenizer.encode(&text))
}

/// Token ids of `text` and whether each is trained on (starts inside one of
/// `spans`), with the end-of-sequence token appended when missing.
fn tokenize(
    tokenizer: &Tokenizer,
    text: &str,
    spans: &[Range<usize>],
    eos: Option<u32>,
) -> (Vec<u32>, Vec<bool>) {
    let (mut ids, starts) = tokenizer.encode_with_starts(text);
    let mut trained: Vec<bool> = starts
        .iter()
        .map(|s| spans.iter().any(|span| span.contains(s)))
        .collect();
    if let Some(eos) = eos.filter(|&e| ids.last() != Some(&e)) {
        let last = trained.last().copied().unwrap_or(false);
        ids.push(eos);
        trained.push(last);
    }
    (ids, trained)
}

/// An example's token ids and whether each is trained on.
type Example = (Vec<u32>, Vec<bool>);

/// What [`pack`] made.
struct Packed {
    windows: Windows,
    /// Examples truncated to a window.
    truncated: usize,
    /// Examples with trained tokens none of which is a target in its window.
    emptied: usize,
}

/// Windows of `seq_len` inputs: examples appended while they fit in
/// `seq_len + 1` tokens (one per window without `packing`), the rest `pad`;
/// a target is the next token where that token is trained on and belongs
/// to the same example. Packed windows keep each example's start and the
/// padding's ([`Windows::starts`]).
fn pack(examples: &[Example], seq_len: usize, packing: bool, pad: u32) -> Packed {
    let span = seq_len + 1;
    let mut windows = Windows {
        seq_len,
        inputs: Vec::new(),
        targets: Vec::new(),
        starts: Vec::new(),
    };
    let (mut truncated, mut emptied) = (0, 0);
    let mut tokens: Vec<u32> = Vec::with_capacity(span);
    let mut trained: Vec<bool> = Vec::with_capacity(span);
    // Where the window's examples start, in its tokens.
    let mut starts: Vec<usize> = Vec::new();
    let mut flush = |tokens: &mut Vec<u32>, trained: &mut Vec<bool>, starts: &mut Vec<usize>| {
        if tokens.is_empty() {
            return;
        }
        // An example's first token is not the previous one's target.
        for &start in &starts[1..] {
            trained[start] = false;
        }
        // The padding is a document of its own: no example sees it.
        if tokens.len() < seq_len {
            starts.push(tokens.len());
        }
        tokens.resize(span, pad);
        trained.resize(span, false);
        windows.inputs.extend_from_slice(&tokens[..seq_len]);
        windows.targets.extend((1..span).map(|j| {
            if trained[j] {
                i64::from(tokens[j])
            } else {
                IGNORE_INDEX
            }
        }));
        if packing {
            windows.starts.push(std::mem::take(starts));
        }
        tokens.clear();
        trained.clear();
        starts.clear();
    };
    for (ids, marks) in examples {
        let n = if ids.len() > span {
            truncated += 1;
            span
        } else {
            ids.len()
        };
        if !packing || tokens.len() + n > span {
            flush(&mut tokens, &mut trained, &mut starts);
        }
        // An example's first token is no one's target.
        if marks.contains(&true) && !marks[1.min(n)..n].contains(&true) {
            emptied += 1;
        }
        starts.push(tokens.len());
        tokens.extend_from_slice(&ids[..n]);
        trained.extend_from_slice(&marks[..n]);
    }
    flush(&mut tokens, &mut trained, &mut starts);
    Packed {
        windows,
        truncated,
        emptied,
    }
}

/// The conversation a record holds, in `format`.
fn conversation(record: &Record, format: DataFormat) -> Result<Vec<Message>, InstructError> {
    let fail = |reason: String| InstructError::Record {
        path: record.path.clone(),
        at: record.at.clone(),
        reason,
    };
    let text = |v: &Value, key: &str| -> Result<String, InstructError> {
        v.get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| fail(format!("no string field `{key}`")))
    };
    let v = &record.value;
    let messages = match format {
        DataFormat::Alpaca => {
            let instruction = text(v, "instruction")?;
            let input = v.get("input").and_then(Value::as_str).unwrap_or("");
            let prompt = if input.trim().is_empty() {
                instruction
            } else {
                format!("{instruction}\n\n{input}")
            };
            let mut messages = Vec::new();
            if let Some(system) = v.get("system").and_then(Value::as_str) {
                messages.push(Message::new("system", system));
            }
            messages.push(Message::new("user", &prompt));
            messages.push(Message::new("assistant", &text(v, "output")?));
            messages
        }
        DataFormat::Sharegpt | DataFormat::Chat => {
            let (list, role_key, content_key) = match format {
                DataFormat::Sharegpt => ("conversations", "from", "value"),
                _ => ("messages", "role", "content"),
            };
            let turns = v
                .get(list)
                .and_then(Value::as_array)
                .ok_or_else(|| fail(format!("no list `{list}`")))?;
            turns
                .iter()
                .enumerate()
                .map(|(i, turn)| {
                    let role = text(turn, role_key)
                        .map_err(|_| fail(format!("turn {i} has no string `{role_key}`")))?;
                    let role = match role.as_str() {
                        "system" => "system",
                        "user" | "human" => "user",
                        "assistant" | "gpt" => "assistant",
                        other => {
                            return Err(fail(format!(
                                "turn {i} has role `{other}` (supported: system, user/human, assistant/gpt)"
                            )))
                        }
                    };
                    let content = text(turn, content_key)
                        .map_err(|_| fail(format!("turn {i} has no string `{content_key}`")))?;
                    Ok(Message::new(role, &content))
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        DataFormat::Auto | DataFormat::Text => {
            unreachable!("text data does not go through conversations")
        }
    };
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err(fail("has no assistant turn (nothing to train on)".into()));
    }
    Ok(messages)
}

/// The `.json`/`.jsonl`/`.parquet` files at `path`: itself, or those under
/// the folder (a dataset's `data/` included), sorted.
fn record_files(path: &Path) -> Result<Vec<PathBuf>, InstructError> {
    const EXTENSIONS: [&str; 3] = ["json", "jsonl", "parquet"];
    let is_records = |p: &Path| {
        p.extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
    };
    if !path.exists() {
        return Err(InstructError::NotFound(path.to_path_buf()));
    }
    if !path.is_dir() {
        fs::metadata(path).map_err(|error| InstructError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        return Ok(if is_records(path) || is_parquet(path) {
            vec![path.to_path_buf()]
        } else {
            Vec::new()
        });
    }
    let mut files = Vec::new();
    collect_files(path, &EXTENSIONS, &mut files)?;
    files.sort();
    Ok(files)
}

/// The records of one file (at most `limit`): JSON Lines, a JSON array, or
/// Parquet rows.
fn read_records(path: &Path, limit: Option<usize>) -> Result<Vec<Record>, InstructError> {
    if is_parquet(path) {
        let mut records = Vec::new();
        parquet::for_each_row(path, &RECORD_FIELDS, ANY_FORMAT, |row, value| {
            records.push(Record {
                path: path.to_path_buf(),
                at: format!("row {row}"),
                value,
            });
            Ok::<(), InstructError>(())
        })?;
        records.truncate(limit.unwrap_or(usize::MAX));
        return Ok(records);
    }
    let text = fs::read_to_string(path).map_err(|error| InstructError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let limit = limit.unwrap_or(usize::MAX);
    if text.trim_start().starts_with('[') {
        let values: Vec<Value> =
            serde_json::from_str(text).map_err(|error| InstructError::Json {
                path: path.to_path_buf(),
                at: "(a JSON array)".into(),
                error,
            })?;
        return Ok(values
            .into_iter()
            .take(limit)
            .enumerate()
            .map(|(i, value)| Record {
                path: path.to_path_buf(),
                at: format!("record {}", i + 1),
                value,
            })
            .collect());
    }
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if records.len() == limit {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("line {}", i + 1);
        let value = serde_json::from_str(line).map_err(|error| InstructError::Json {
            path: path.to_path_buf(),
            at: at.clone(),
            error,
        })?;
        records.push(Record {
            path: path.to_path_buf(),
            at,
            value,
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_fills_windows_and_masks_what_is_not_trained() {
        // Two examples of 3 tokens and one of 7 (one more than a window).
        let ex = |ids: &[u32], trained: &[bool]| (ids.to_vec(), trained.to_vec());
        let examples = [
            ex(&[1, 2, 3], &[false, true, true]),
            ex(&[4, 5, 6], &[false, false, true]),
            ex(&[7, 8, 9, 10, 11, 12, 13], &[true; 7]),
        ];
        let Packed {
            windows: w,
            truncated,
            emptied,
        } = pack(&examples, 5, true, 0);
        assert_eq!((truncated, emptied), (1, 0));
        assert_eq!(w.count(), 2);
        let ig = IGNORE_INDEX;
        assert_eq!(w.inputs, [1, 2, 3, 4, 5, 7, 8, 9, 10, 11]);
        assert_eq!(w.targets, [2, 3, ig, ig, 6, 8, 9, 10, 11, 12]);
        assert_eq!(w.starts, [vec![0, 3], vec![0]]);
        let Packed {
            windows: w,
            truncated,
            ..
        } = pack(&examples, 5, false, 99);
        assert_eq!((w.count(), truncated), (3, 1));
        assert_eq!(&w.inputs[..5], [1, 2, 3, 99, 99]);
        assert_eq!(&w.targets[..5], [2, 3, ig, ig, ig]);
        assert!(
            w.starts.is_empty(),
            "one example a window needs no boundaries"
        );
    }

    /// Trained on every token (`--train-on-prompt`), an example's last
    /// token does not learn the next example's first: packed, each example
    /// has the targets it has alone in a window; the padding starts a
    /// document of its own.
    #[test]
    fn packed_examples_keep_their_own_targets_and_starts() {
        let ex = |ids: &[u32]| (ids.to_vec(), vec![true; ids.len()]);
        let examples = [ex(&[1, 2, 3]), ex(&[4, 5]), ex(&[6, 7, 8, 9])];
        let packed = pack(&examples, 7, true, 0).windows;
        let ig = IGNORE_INDEX;
        assert_eq!(packed.inputs, [1, 2, 3, 4, 5, 0, 0, 6, 7, 8, 9, 0, 0, 0]);
        assert_eq!(
            packed.targets,
            [2, 3, ig, 5, ig, ig, ig, 7, 8, 9, ig, ig, ig, ig]
        );
        assert_eq!(packed.starts, [vec![0, 3, 5], vec![0, 4]]);
        let alone = pack(&examples, 7, false, 0).windows;
        let seq = 7;
        // (window, start, length) of each example, packed.
        for (example, (w, start, len)) in [(0, 0, 3), (0, 3, 2), (1, 0, 4)].into_iter().enumerate()
        {
            let got = &packed.targets[w * seq + start..w * seq + start + len];
            let want = &alone.targets[example * seq..example * seq + len];
            assert_eq!(got, want, "example {example}");
        }
    }

    #[test]
    fn examples_cut_before_their_first_trained_token_are_counted_and_their_windows_dropped() {
        let ex = |ids: &[u32], trained: &[bool]| (ids.to_vec(), trained.to_vec());
        // A prompt of 6 tokens and a reply of 2: a window of 4 inputs holds
        // the prompt only; the second example fits whole.
        let examples = [
            ex(
                &[1, 2, 3, 4, 5, 6, 7, 8],
                &[false, false, false, false, false, false, true, true],
            ),
            ex(&[9, 10, 11], &[false, true, true]),
        ];
        let packed = pack(&examples, 4, false, 0);
        assert_eq!((packed.truncated, packed.emptied), (1, 1));
        let (kept, dropped) = packed.windows.without_untrained();
        assert_eq!((kept.count(), dropped), (1, 1));
        assert_eq!(kept.inputs, [9, 10, 11, 0]);
        // An example whose only trained token opens a window trains on nothing.
        let packed = pack(&[ex(&[5, 6], &[true, false])], 4, true, 0);
        assert_eq!(packed.emptied, 1);
    }
}
