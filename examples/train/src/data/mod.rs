//! Training data for the examples: reading a text corpus from disk, a built-in
//! synthetic corpus, and a seeded random-window batcher.
//!
//! Everything that involves randomness here (the built-in corpus and the
//! batcher) uses a private SplitMix64 generator instead of `rand`, so the
//! produced bytes and batches never change with a dependency upgrade and a
//! run can be resumed bit-exactly from a checkpointed generator state.
//!
//! Held-out windows ([`EvalWindows`]) are evaluated in a fixed order,
//! apart from the batcher.
//!
//! Parquet files ([`parquet`]) are read row by row into the records a JSON
//! Lines file gives, for text and instruction data alike.
//!
//! The token cache ([`token_cache`]) keeps a tokenized corpus on disk for the
//! batcher to map.

mod batcher;
mod builtin;
mod corpus;
mod error;
mod held_out;
pub mod parquet;
mod rng;
pub mod token_cache;

pub use self::parquet::ParquetError;
pub use batcher::{trained_targets, Batcher, Windows};
pub use builtin::default_corpus;
pub(crate) use corpus::{collect_files, is_parquet};
pub use corpus::{corpus_files, read_corpus};
pub use error::DataError;
pub use held_out::{held_out_tokens, split_windows, EvalBatch, EvalWindows};
