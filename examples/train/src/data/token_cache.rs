//! Tokenized corpora on disk. A text corpus is cut into documents (files,
//! JSONL records, Parquet rows, and large text files at blank lines every few MB), each
//! document into pieces of about 64 KiB at places where the tokenizer splits
//! anyway ([`pieces`]), the pieces are tokenized in parallel (rayon) a batch at
//! a time, and the ids are written to `tokens.bin` (u16 where the vocabulary
//! fits, else u32) in a cache folder keyed by the data files (path, size,
//! modification time) and the tokenizer. Later runs and resumes map the file
//! instead of tokenizing again, and the batcher reads windows from the map:
//! the corpus never sits in memory as one string or one `Vec`.
//!
//! Pieces bound the tokenizer's working memory: a Hugging Face tokenizer keeps
//! offsets, alignments and a string per token while it encodes, about 100
//! bytes per byte of text, so a document encoded whole (a 50 MB file without
//! blank lines) would need gigabytes.
//!
//! Documents are separated by the tokens of a blank line, as
//! [`crate::data::read_corpus`] joins them.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::corpus::{
    corpus_files, has_extension, is_parquet, parquet_documents, read_corpus_file, DOC_SEPARATOR,
};
use super::error::DataError;
use crate::tokenizer::Tokenizer;

/// Text tokenized per batch of pieces: bounds the ids held before they are
/// written.
const BATCH_BYTES: usize = 8 << 20;
/// Large text files are cut at the first blank line after this many bytes.
pub const CHUNK_BYTES: usize = 4 << 20;
/// A document is cut into pieces at the first clean cut after this many bytes.
pub const PIECE_BYTES: usize = 16 << 10;
/// A piece that has found no clean cut by this many bytes (text without
/// spaces or line breaks) is cut at a character boundary, and counted.
pub const MAX_PIECE_BYTES: usize = 1 << 20;
/// Bytes of text on each side of a cut that [`Tokenizer::cuts_cleanly`] checks.
const CUT_CHECK_BYTES: usize = 256;
/// Places a piece checks for a clean cut before it gives up.
const MAX_CUT_CHECKS: usize = 8;
/// Bumped when the file layout or the cutting rules change.
const CACHE_VERSION: u32 = 2;

/// A memory-mapped token file.
pub struct TokenFile {
    map: memmap2::Mmap,
    /// Bytes per id: 2 or 4.
    width: usize,
}

impl TokenFile {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.map.len() / self.width
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token `i`.
    pub fn get(&self, i: usize) -> u32 {
        let at = i * self.width;
        match self.width {
            2 => u16::from_le_bytes([self.map[at], self.map[at + 1]]) as u32,
            _ => u32::from_le_bytes([
                self.map[at],
                self.map[at + 1],
                self.map[at + 2],
                self.map[at + 3],
            ]),
        }
    }
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TokenFile({} tokens of {} bytes)",
            self.len(),
            self.width
        )
    }
}

/// What the cache folder records beside `tokens.bin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Meta {
    version: u32,
    tokenizer: String,
    tokens: usize,
    width: usize,
    /// CRC32 of the ids as little-endian u32 (the corpus identity checkpoints
    /// record, whatever the width on disk).
    crc32: u32,
    sources: Vec<String>,
    /// See [`Tokenized::forced_cuts`].
    #[serde(default)]
    forced_cuts: usize,
}

/// A tokenized corpus, from the cache or made now.
#[derive(Debug)]
pub struct Tokenized {
    pub tokens: TokenFile,
    /// CRC32 of the ids as little-endian u32.
    pub crc32: u32,
    /// The cache folder holding it.
    pub folder: PathBuf,
    /// Tokens per second of tokenization; `None` when read from the cache.
    pub tokens_per_s: Option<f64>,
    /// Pieces cut where the text had neither a space nor a line break for
    /// [`MAX_PIECE_BYTES`] (the ids there may differ from encoding the
    /// document whole); recorded in the cache.
    pub forced_cuts: usize,
}

/// The default cache root: `$XDG_CACHE_HOME/burn-offload/tokens`, else
/// `~/.cache/burn-offload/tokens`, else `.burn-offload-cache` here.
pub fn default_root() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    match base {
        Some(base) => base.join("burn-offload").join("tokens"),
        None => PathBuf::from(".burn-offload-cache"),
    }
}

/// The corpus at `data` tokenized with `tokenizer`, from the cache under
/// `root` when it holds it, else tokenized now and stored there.
pub fn tokenize(data: &Path, tokenizer: &Tokenizer, root: &Path) -> Result<Tokenized, DataError> {
    let files = corpus_files(data)?;
    let mut sources = Vec::with_capacity(files.len());
    for file in &files {
        let meta = fs::metadata(file).map_err(|e| DataError::io(file, e))?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let path = fs::canonicalize(file).unwrap_or_else(|_| file.clone());
        sources.push(format!("{} {} {modified}", path.display(), meta.len()));
    }
    let key = format!(
        "{:016x}",
        fnv1a64(
            format!(
                "v{CACHE_VERSION} {} {}",
                tokenizer.name(),
                sources.join("\n")
            )
            .as_bytes()
        )
    );
    let folder = root.join(&key);
    if let Some(cached) = open_cached(&folder, tokenizer) {
        return Ok(cached);
    }

    let width = if tokenizer.vocab_size() <= 1 << 16 {
        2
    } else {
        4
    };
    fs::create_dir_all(root).map_err(|e| cache_error(root, e))?;
    let tmp = root.join(format!(".tmp-{key}-{}", std::process::id()));
    fs::create_dir_all(&tmp).map_err(|e| cache_error(&tmp, e))?;
    let bin = tmp.join("tokens.bin");
    let started = Instant::now();
    let written = write_tokens(&files, tokenizer, width, &bin);
    let Written {
        count,
        crc32,
        forced_cuts,
    } = match written {
        Ok(done) => done,
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    if count == 0 {
        let _ = fs::remove_dir_all(&tmp);
        return Err(DataError::Empty(data.to_path_buf()));
    }
    let tokens_per_s = count as f64 / started.elapsed().as_secs_f64().max(1e-9);
    let meta = Meta {
        version: CACHE_VERSION,
        tokenizer: tokenizer.name().to_string(),
        tokens: count,
        width,
        crc32,
        sources,
        forced_cuts,
    };
    let meta_path = tmp.join("meta.json");
    fs::write(
        &meta_path,
        serde_json::to_vec_pretty(&meta).expect("meta serialises"),
    )
    .map_err(|e| cache_error(&meta_path, e))?;
    // Another run may have cached the same corpus meanwhile: either copy will do.
    if fs::rename(&tmp, &folder).is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    let mut tokenized = open_cached(&folder, tokenizer)
        .ok_or_else(|| cache_error(&folder, std::io::Error::other("could not be read back")))?;
    tokenized.tokens_per_s = Some(tokens_per_s);
    Ok(tokenized)
}

/// The cached corpus in `folder`, when it is complete and for this tokenizer.
fn open_cached(folder: &Path, tokenizer: &Tokenizer) -> Option<Tokenized> {
    let meta: Meta = serde_json::from_slice(&fs::read(folder.join("meta.json")).ok()?).ok()?;
    let file = File::open(folder.join("tokens.bin")).ok()?;
    // SAFETY: cache files are written to a temporary folder and renamed
    // into place, never modified afterwards.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let usable = meta.version == CACHE_VERSION
        && meta.tokenizer == tokenizer.name()
        && map.len() == meta.tokens * meta.width;
    usable.then(|| Tokenized {
        tokens: TokenFile {
            map,
            width: meta.width,
        },
        crc32: meta.crc32,
        folder: folder.to_path_buf(),
        tokens_per_s: None,
        forced_cuts: meta.forced_cuts,
    })
}

/// What [`write_tokens`] wrote.
struct Written {
    count: usize,
    crc32: u32,
    forced_cuts: usize,
}

/// Tokenizes the documents of `files` in order into `bin`, each cut into
/// [`pieces`] and a batch of pieces encoded in parallel.
///
/// Consecutive Parquet files are one table (a dataset's shards): their rows
/// continue one text, as the lines of one JSONL file do, so shards give the
/// tokens their concatenation would, and a Parquet file those of the JSONL
/// file with the same records.
fn write_tokens(
    files: &[PathBuf],
    tokenizer: &Tokenizer,
    width: usize,
    bin: &Path,
) -> Result<Written, DataError> {
    let out = BufWriter::new(File::create(bin).map_err(|e| cache_error(bin, e))?);
    let mut encoder = Encoder {
        tokenizer,
        separator: tokenizer.encode(DOC_SEPARATOR),
        out,
        bin,
        width,
        crc: crc32fast::Hasher::new(),
        count: 0,
        first: true,
        forced_cuts: 0,
    };
    let mut table = Joined::new(CHUNK_BYTES);
    for file in files {
        if is_parquet(file) {
            parquet_documents(file, |doc| {
                table.push(doc);
                while let Some(end) = table.chunk_end() {
                    encoder.text(&table.text[..end])?;
                    table.drop_chunk(end);
                }
                Ok(())
            })?;
            continue;
        }
        encoder.text(&table.take())?;
        // JSONL records are gathered into text; a text file is mapped, not read.
        let (owned, mapped);
        let text: &str = if has_extension(file, "jsonl") {
            owned = read_corpus_file(file)?;
            &owned
        } else {
            let handle = File::open(file).map_err(|e| DataError::io(file, e))?;
            // SAFETY: read-only; the corpus is not written while it is tokenized.
            mapped = unsafe { memmap2::Mmap::map(&handle) }.map_err(|e| DataError::io(file, e))?;
            let text = std::str::from_utf8(&mapped).map_err(|e| DataError::NotUtf8 {
                path: file.clone(),
                offset: e.valid_up_to(),
            })?;
            text.strip_prefix('\u{feff}').unwrap_or(text)
        };
        encoder.text(text)?;
    }
    encoder.text(&table.take())?;
    let Encoder {
        mut out,
        crc,
        count,
        forced_cuts,
        ..
    } = encoder;
    out.flush().map_err(|e| cache_error(bin, e))?;
    Ok(Written {
        count,
        crc32: crc.finalize(),
        forced_cuts,
    })
}

/// Writes the ids of texts to the token file, a blank line's ids between
/// documents.
struct Encoder<'a> {
    tokenizer: &'a Tokenizer,
    /// The ids of [`DOC_SEPARATOR`].
    separator: Vec<u32>,
    out: BufWriter<File>,
    bin: &'a Path,
    /// Bytes per id.
    width: usize,
    crc: crc32fast::Hasher,
    count: usize,
    /// Nothing written yet: the next document needs no separator.
    first: bool,
    forced_cuts: usize,
}

impl Encoder<'_> {
    /// Encodes `text` (one file's, or a chunk of a Parquet table's): its
    /// documents are its chunks as [`cut`] makes them.
    fn text(&mut self, text: &str) -> Result<(), DataError> {
        // (starts a document, piece), a batch of BATCH_BYTES at a time.
        let mut batch: Vec<(bool, &str)> = Vec::new();
        let mut batch_bytes = 0;
        for document in cut(text, CHUNK_BYTES).filter(|c| !c.is_empty()) {
            let mut cuts = pieces(document, self.tokenizer);
            let mut starts = true;
            for piece in cuts.by_ref() {
                batch.push((std::mem::take(&mut starts), piece));
                batch_bytes += piece.len();
                if batch_bytes >= BATCH_BYTES {
                    self.flush(&mut batch)?;
                    batch_bytes = 0;
                }
            }
            self.forced_cuts += cuts.forced;
        }
        self.flush(&mut batch)
    }

    /// Encodes `batch` in parallel and writes its ids in order.
    fn flush(&mut self, batch: &mut Vec<(bool, &str)>) -> Result<(), DataError> {
        let tokenizer = self.tokenizer;
        let encoded: Vec<Vec<u32>> = batch.par_iter().map(|(_, p)| tokenizer.encode(p)).collect();
        for ((starts, _), ids) in batch.iter().zip(&encoded) {
            if *starts && !std::mem::take(&mut self.first) {
                let separator = std::mem::take(&mut self.separator);
                let written = self.write(&separator);
                self.separator = separator;
                written?;
            }
            self.write(ids)?;
        }
        batch.clear();
        Ok(())
    }

    fn write(&mut self, ids: &[u32]) -> Result<(), DataError> {
        for &id in ids {
            let bytes = id.to_le_bytes();
            self.crc.update(&bytes);
            self.out
                .write_all(&bytes[..self.width])
                .map_err(|e| cache_error(self.bin, e))?;
        }
        self.count += ids.len();
        Ok(())
    }
}

/// The documents of a Parquet table joined by blank lines, held until
/// [`cut`] would cut the joined text: at the first blank line after `size`
/// bytes ([`CHUNK_BYTES`]). Memory holds a chunk and a document at most.
struct Joined {
    text: String,
    /// A document has been pushed: the next one follows a blank line.
    started: bool,
    size: usize,
}

impl Joined {
    fn new(size: usize) -> Self {
        Joined {
            text: String::new(),
            started: false,
            size,
        }
    }

    fn push(&mut self, doc: &str) {
        if std::mem::replace(&mut self.started, true) {
            self.text.push_str(DOC_SEPARATOR);
        }
        self.text.push_str(doc);
    }

    /// Where the first whole chunk held ends, if one is: the blank lines
    /// after it are all there, so more text cannot move the cut.
    fn chunk_end(&self) -> Option<usize> {
        if self.text.len() < self.size {
            return None;
        }
        self.text.as_bytes()[self.size..]
            .windows(DOC_SEPARATOR.len())
            .position(|w| w == DOC_SEPARATOR.as_bytes())
            .map(|at| self.size + at)
    }

    /// Drops the chunk ending at `end` and the blank line after it.
    fn drop_chunk(&mut self, end: usize) {
        self.text.drain(..end + DOC_SEPARATOR.len());
    }

    /// The rest of the table's text; the next table starts anew.
    fn take(&mut self) -> String {
        self.started = false;
        std::mem::take(&mut self.text)
    }
}

/// `text` cut into pieces of at least [`PIECE_BYTES`] whose encodings,
/// joined, are the encoding of `text`: each cut is made before a space that
/// follows a character other than whitespace, or after a line break that
/// precedes one (where byte-level and whitespace pre-tokenizers split anyway),
/// and only where [`Tokenizer::cuts_cleanly`] confirms it, which a piece asks
/// at [`MAX_CUT_CHECKS`] places at most. A piece that finds no such place
/// within [`MAX_PIECE_BYTES`] is cut at a character boundary there, and
/// counted in [`Pieces::forced`].
pub fn pieces<'a>(text: &'a str, tokenizer: &'a Tokenizer) -> Pieces<'a> {
    Pieces {
        rest: text,
        tokenizer,
        forced: 0,
    }
}

/// The iterator [`pieces`] returns.
pub struct Pieces<'a> {
    rest: &'a str,
    tokenizer: &'a Tokenizer,
    /// Cuts made at a character boundary for want of a clean one.
    pub forced: usize,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = self.rest;
        if rest.is_empty() {
            return None;
        }
        if rest.len() <= PIECE_BYTES {
            self.rest = "";
            return Some(rest);
        }
        let bytes = rest.as_bytes();
        let limit = MAX_PIECE_BYTES.min(rest.len());
        let candidate = |at: usize| match bytes[at] {
            // Before a space that follows a non-space character.
            b' ' => rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| !c.is_whitespace()),
            // After a line break that precedes a non-space character.
            _ if bytes[at - 1] == b'\n' => rest[at..]
                .chars()
                .next()
                .is_some_and(|c| !c.is_whitespace()),
            _ => false,
        };
        // A tokenizer that changes its ids at one place where text splits
        // into words does so at the next: a few refusals, spread apart, end
        // the search (each check encodes a few hundred bytes three times).
        let mut checks = 0;
        let mut at = PIECE_BYTES;
        let mut clean = None;
        while at < limit && checks < MAX_CUT_CHECKS {
            if candidate(at) {
                checks += 1;
                if self.tokenizer.cuts_cleanly(rest, at, CUT_CHECK_BYTES) {
                    clean = Some(at);
                    break;
                }
                at += CUT_CHECK_BYTES;
            } else {
                at += 1;
            }
        }
        let at = match clean {
            Some(at) => at,
            None if limit == rest.len() => limit,
            None => {
                self.forced += 1;
                (0..=limit)
                    .rev()
                    .find(|&i| rest.is_char_boundary(i))
                    .unwrap_or(limit)
            }
        };
        let (piece, tail) = rest.split_at(at);
        self.rest = tail;
        Some(piece)
    }
}

/// `text` cut at the first blank line after every `size` bytes (the blank
/// line itself dropped: documents are joined by one again).
pub fn cut(text: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let from = size.min(rest.len());
        // Byte search: "\n\n" is ASCII, so a match is a char boundary.
        match rest.as_bytes()[from..]
            .windows(DOC_SEPARATOR.len())
            .position(|w| w == DOC_SEPARATOR.as_bytes())
        {
            Some(at) => {
                let (chunk, tail) = rest.split_at(from + at);
                rest = &tail[DOC_SEPARATOR.len()..];
                Some(chunk)
            }
            None => Some(std::mem::take(&mut rest)),
        }
    })
}

fn cache_error(path: &Path, error: std::io::Error) -> DataError {
    DataError::Cache {
        path: path.to_path_buf(),
        error,
    }
}

/// FNV-1a, 64 bits: a cache key stable across Rust versions.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutting_keeps_every_byte_but_the_separators_it_cuts_at() {
        let text = "aaaa\n\nbbbb\n\ncccc";
        let chunks: Vec<&str> = cut(text, 3).collect();
        assert_eq!(chunks, ["aaaa", "bbbb", "cccc"]);
        assert_eq!(chunks.join(DOC_SEPARATOR), text);
        assert_eq!(cut(text, 100).collect::<Vec<_>>(), [text]);
        assert_eq!(cut("", 3).count(), 0);
    }

    /// Documents pushed one at a time come out in the chunks [`cut`] makes
    /// of them joined, whatever blank lines they hold and wherever they fall.
    #[test]
    fn a_table_streamed_row_by_row_is_cut_as_its_joined_text() {
        let docs = [
            "aaaa", "b\n\nbb", "", "\n", "cccccc\n", "\ndd", "e", "ffff\n\n", "g\n\n\nh",
        ];
        for size in 1..12 {
            for take in 1..=docs.len() {
                let docs: Vec<&str> = docs[..take]
                    .iter()
                    .copied()
                    .filter(|d| !d.is_empty())
                    .collect();
                let joined = docs.join(DOC_SEPARATOR);
                let want: Vec<&str> = cut(&joined, size).filter(|c| !c.is_empty()).collect();
                let mut table = Joined::new(size);
                let mut got = Vec::new();
                for doc in &docs {
                    table.push(doc);
                    while let Some(end) = table.chunk_end() {
                        got.push(table.text[..end].to_string());
                        table.drop_chunk(end);
                    }
                }
                let rest = table.take();
                got.extend(
                    cut(&rest, size)
                        .filter(|c| !c.is_empty())
                        .map(str::to_owned),
                );
                assert_eq!(got, want, "size {size}, {take} documents");
            }
        }
    }
}
