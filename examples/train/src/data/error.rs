//! [`DataError`]: everything that can go wrong while loading data, caching
//! its tokens or setting up batching.

use std::io;
use std::path::{Path, PathBuf};

use super::parquet::ParquetError;

/// Everything that can go wrong while loading data or setting up batching.
///
/// Messages are single lines that name the offending path so that a CLI can
/// print them as-is.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("`{}` does not exist", .0.display())]
    NotFound(PathBuf),

    #[error("`{}` is empty", .0.display())]
    Empty(PathBuf),

    #[error("`{}` is neither a file nor a folder", .0.display())]
    NotAFile(PathBuf),

    #[error("{0}")]
    Parquet(ParquetError),

    #[error("`{}` row {row}: no string in column `text`", path.display())]
    ParquetText { path: PathBuf, row: usize },

    #[error("`{}` contains no .txt, .jsonl or .parquet files", .0.display())]
    NoCorpusFiles(PathBuf),

    #[error("`{}` is not UTF-8 text (invalid byte at offset {offset})", path.display())]
    NotUtf8 { path: PathBuf, offset: usize },

    #[error("`{}` line {line}: JSON object has no string field `text`", path.display())]
    MissingText { path: PathBuf, line: usize },

    // The serde_json error is shown in the message rather than exposed as a
    // `source`, so that error-chain printers do not repeat it.
    #[error("`{}` line {line}: invalid JSON: {error}", path.display())]
    InvalidJson {
        path: PathBuf,
        line: usize,
        error: serde_json::Error,
    },

    #[error("cannot read `{}`: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },

    #[error("seq_len must be at least 1")]
    ZeroSeqLen,

    #[error("the data makes no training window")]
    NoWindows,

    #[error("{starts} lists of document starts for {windows} windows")]
    DocumentCount { starts: usize, windows: usize },

    #[error("window {window}: {error}")]
    Documents {
        window: usize,
        error: burn_offload::DocumentsError,
    },

    #[error("token cache `{}` (--data-cache): {error}", path.display())]
    Cache { path: PathBuf, error: io::Error },

    #[error("corpus has {tokens} tokens but a window needs seq_len + 1 = {needed} tokens")]
    CorpusTooShort { tokens: usize, needed: usize },

    #[error(
        "--eval-split {fraction} holds out {held} of the data's {total} tokens, fewer than one \
         window's {needed} (--seq-len + 1); raise it or give --eval-data"
    )]
    EvalSplitTooSmall {
        fraction: f64,
        held: usize,
        total: usize,
        needed: usize,
    },

    #[error("--eval-split {fraction} leaves no window of the data to train on")]
    EvalSplitLeavesNothing { fraction: f64 },
}

// Not `#[from]`: that would make it a `source` too, and error-chain
// printers would repeat it.
impl From<ParquetError> for DataError {
    fn from(error: ParquetError) -> Self {
        DataError::Parquet(error)
    }
}

impl DataError {
    pub(crate) fn io(path: &Path, error: io::Error) -> Self {
        DataError::Io {
            path: path.to_path_buf(),
            error,
        }
    }
}
