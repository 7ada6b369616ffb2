//! A run's data, read once its options are checked: the training batcher,
//! the identity a resume checks, the sample's prompt, and the held-out
//! windows it evaluates on (`--eval-data`, or `--eval-split`'s share).

use std::path::Path;
use std::sync::Arc;

use super::resume::corpus_crc32;
use crate::data::token_cache;
use crate::data::DataError;
use crate::data::{default_corpus, held_out_tokens, split_windows, Batcher, EvalWindows, Windows};
use crate::error_line::flagged;
use crate::instruct::{self, DataFormat, InstructError, Prepared};
use crate::options::TrainOptions;
use crate::tokenizer::Tokenizer;

/// Why `--data` or `--eval-data` cannot be read, naming the flag.
#[derive(Debug, thiserror::Error)]
pub enum DataReadError {
    #[error("{}", flagged("--data", .0))]
    Data(DataError),
    #[error("{}", flagged("--data", .0))]
    Instructions(InstructError),
    #[error("{}", flagged("--eval-data", .0))]
    EvalData(DataError),
    #[error("{}", flagged("--eval-data", .0))]
    EvalInstructions(InstructError),
}

/// What a run trains and evaluates on.
pub(crate) struct RunData {
    pub batcher: Batcher,
    /// (tokens, crc32) of what the run trains on, for resumes to check.
    pub corpus: (usize, u32),
    /// What the sample after training continues: the data's first tokens,
    /// or for instruction data an example's prompt (an evaluation one's
    /// where `--eval-data` has them).
    pub sample_prompt: Vec<u32>,
    pub eval: Option<EvalWindows>,
}

/// Reads `--data` (the built-in corpus without it) as `format`, and the
/// held-out windows: `--eval-data` read as `eval_format`, or the share of
/// `--data` that `--eval-split` holds out (which the batcher never draws).
pub(crate) fn read(
    opts: &TrainOptions,
    format: DataFormat,
    eval_format: Option<DataFormat>,
    tokenizer: &Tokenizer,
) -> Result<RunData, DataReadError> {
    let split = opts.eval_split;
    let mut data = match (&opts.data, format) {
        (Some(path), DataFormat::Alpaca | DataFormat::Sharegpt | DataFormat::Chat) => {
            let prepared =
                instructions(opts, path, format, tokenizer).map_err(DataReadError::Instructions)?;
            let sample_prompt = prepared.sample_prompt;
            let (windows, eval) = match split {
                Some(fraction) => {
                    let (train, eval) =
                        split_windows(prepared.windows, fraction).map_err(DataReadError::Data)?;
                    (
                        train,
                        Some(EvalWindows::windows(eval).map_err(DataReadError::Data)?),
                    )
                }
                None => (prepared.windows, None),
            };
            RunData {
                corpus: windows_identity(&windows),
                batcher: Batcher::windows(windows, opts.seed).map_err(DataReadError::Data)?,
                sample_prompt,
                eval,
            }
        }
        (Some(path), _) => {
            let (tokens, crc32) = text(opts, path, tokenizer, "corpus")?;
            let tokens = Arc::new(tokens);
            let (train, eval) = stream_split(tokens.len(), split, opts.seq_len)?;
            let eval = match eval {
                Some(start) => Some(
                    EvalWindows::mapped(tokens.clone(), start, opts.seq_len)
                        .map_err(DataReadError::Data)?,
                ),
                None => None,
            };
            RunData {
                // The cache's checksum covers the whole stream; a split's
                // is of the part trained on.
                corpus: match eval {
                    None => (train, crc32),
                    Some(_) => (train, corpus_crc32((0..train).map(|i| tokens.get(i)))),
                },
                sample_prompt: text_prompt(opts, train, &|i| tokens.get(i)),
                batcher: Batcher::mapped(tokens, train, opts.seq_len, opts.seed)
                    .map_err(DataReadError::Data)?,
                eval,
            }
        }
        (None, _) => {
            let mut tokens = tokenizer.encode(&default_corpus());
            let (train, eval) = stream_split(tokens.len(), split, opts.seq_len)?;
            let eval = match eval {
                Some(start) => Some(
                    EvalWindows::stream(tokens.split_off(start), opts.seq_len)
                        .map_err(DataReadError::Data)?,
                ),
                None => None,
            };
            tokens.truncate(train);
            RunData {
                corpus: (tokens.len(), corpus_crc32(tokens.iter().copied())),
                sample_prompt: text_prompt(opts, tokens.len(), &|i| tokens[i]),
                batcher: Batcher::new(tokens, opts.seq_len, opts.seed)
                    .map_err(DataReadError::Data)?,
                eval,
            }
        }
    };
    if let (Some(path), Some(format)) = (&opts.eval_data, eval_format) {
        let eval = match format {
            DataFormat::Alpaca | DataFormat::Sharegpt | DataFormat::Chat => {
                let prepared = instructions(opts, path, format, tokenizer)
                    .map_err(DataReadError::EvalInstructions)?;
                data.sample_prompt = prepared.sample_prompt;
                EvalWindows::windows(prepared.windows)
            }
            _ => {
                let tokens = text(opts, path, tokenizer, "evaluation corpus")
                    .map_err(|e| match e {
                        DataReadError::Data(e) => DataReadError::EvalData(e),
                        e => e,
                    })?
                    .0;
                EvalWindows::mapped(Arc::new(tokens), 0, opts.seq_len)
            }
        };
        data.eval = Some(eval.map_err(DataReadError::EvalData)?);
    }
    Ok(data)
}

/// The records at `path` rendered, tokenized and packed into windows.
fn instructions(
    opts: &TrainOptions,
    path: &Path,
    format: DataFormat,
    tokenizer: &Tokenizer,
) -> Result<Prepared, instruct::InstructError> {
    let shaping = instruct::Shaping {
        format,
        seq_len: opts.seq_len,
        train_on_prompt: opts.train_on_prompt,
        packing: opts.packing,
    };
    let prepared = instruct::prepare(path, shaping, tokenizer)?;
    prepared.check_trains()?;
    if opts.progress {
        report(&prepared, opts);
    }
    Ok(prepared)
}

/// What instruction data made, on stderr.
fn report(prepared: &Prepared, opts: &TrainOptions) {
    eprintln!(
        "{} data: {} examples, {} tokens ({:.0} tok/s tokenized), {} truncated to --seq-len, {} \
         windows{}, {} targets trained on",
        prepared.format,
        prepared.examples,
        prepared.tokens,
        prepared.tokens_per_s,
        prepared.truncated,
        prepared.windows.count(),
        if opts.packing {
            " (packed, each example attending only to itself)"
        } else {
            ""
        },
        prepared.trained,
    );
    if prepared.emptied > 0 {
        eprintln!(
            "warning: --seq-len {} leaves no token to train on in {} of the {} examples (the \
             longest, {}, has {} tokens); {} windows without a trained token dropped",
            opts.seq_len,
            prepared.emptied,
            prepared.examples,
            prepared.longest.1,
            prepared.longest.0,
            prepared.dropped_windows
        );
    }
}

/// The text corpus at `path`, tokenized through the token cache.
fn text(
    opts: &TrainOptions,
    path: &Path,
    tokenizer: &Tokenizer,
    what: &str,
) -> Result<(token_cache::TokenFile, u32), DataReadError> {
    let root = opts
        .data_cache
        .clone()
        .unwrap_or_else(token_cache::default_root);
    let tokenized = token_cache::tokenize(path, tokenizer, &root).map_err(DataReadError::Data)?;
    if opts.progress {
        let how = match tokenized.tokens_per_s {
            Some(rate) => format!("tokenized at {rate:.0} tok/s into"),
            None => "read from".to_string(),
        };
        let forced = match tokenized.forced_cuts {
            0 => String::new(),
            n => format!(" ({n} pieces cut inside a run of 1 MiB without a space or line break)"),
        };
        eprintln!(
            "{what}: {} tokens, {how} `{}`{forced}",
            tokenized.tokens.len(),
            tokenized.folder.display()
        );
    }
    Ok((tokenized.tokens, tokenized.crc32))
}

/// A stream of `len` tokens cut for `--eval-split`: the tokens trained on
/// (the first), and where the held-out ones start, if any are.
fn stream_split(
    len: usize,
    split: Option<f64>,
    seq_len: usize,
) -> Result<(usize, Option<usize>), DataReadError> {
    match split {
        Some(fraction) => {
            let held = held_out_tokens(len, fraction, seq_len).map_err(DataReadError::Data)?;
            Ok((len - held, Some(len - held)))
        }
        None => Ok((len, None)),
    }
}

/// The sample after training continues the data's first tokens.
fn text_prompt(opts: &TrainOptions, len: usize, token: &dyn Fn(usize) -> u32) -> Vec<u32> {
    (0..len.min(16).min(opts.seq_len.div_ceil(2)))
        .map(token)
        .collect()
}

/// The windows' identity for resumes: the inputs, then the targets (ignored
/// ones as their u32 bits).
fn windows_identity(windows: &Windows) -> (usize, u32) {
    let identity = windows
        .inputs
        .iter()
        .copied()
        .chain(windows.targets.iter().map(|&t| t as u32));
    (windows.inputs.len(), corpus_crc32(identity))
}
