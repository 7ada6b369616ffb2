//! Training data for the examples: reading a text corpus from disk, a built-in
//! synthetic corpus, and a seeded random-window batcher.
//!
//! Everything that involves randomness here (the built-in corpus and the
//! batcher) uses a private SplitMix64 generator instead of `rand`, so the
//! produced bytes and batches never change with a dependency upgrade and a
//! run can be resumed bit-exactly from a checkpointed generator state.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use burn_offload::Documents;

/// Separator placed between documents (files, JSONL records) in a corpus.
pub(crate) const DOC_SEPARATOR: &str = "\n\n";

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

    #[error(
        "`{}` is a Parquet file, which is not read yet; convert it to JSON Lines (with pandas: \
         `pandas.read_parquet(path).to_json(out, orient=\"records\", lines=True)`)",
        .0.display()
    )]
    Parquet(PathBuf),

    #[error(
        "`{}` contains no .txt or .jsonl files{}",
        path.display(),
        if *parquet > 0 {
            format!(" ({parquet} Parquet files, which are not read yet; convert them to JSON Lines)")
        } else {
            String::new()
        }
    )]
    NoCorpusFiles { path: PathBuf, parquet: usize },

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
}

impl DataError {
    pub(crate) fn io(path: &Path, error: io::Error) -> Self {
        DataError::Io {
            path: path.to_path_buf(),
            error,
        }
    }
}

// ---------------------------------------------------------------------------
// Corpus reading
// ---------------------------------------------------------------------------

/// Reads a training corpus from `path`.
///
/// * A `.jsonl` file is read as one JSON object per line; the string field
///   `text` of each object is a document. Blank lines are skipped.
/// * Any other file is read as UTF-8 text.
/// * A directory contributes every `.txt` and `.jsonl` file inside it,
///   recursively, in sorted path order so the corpus is the same on every run.
///
/// Documents are joined with a blank line. An empty result is an error, since
/// training on nothing would only fail later with a less helpful message.
pub fn read_corpus(path: &Path) -> Result<String, DataError> {
    let files = corpus_files(path)?;
    let mut docs = Vec::with_capacity(files.len());
    for file in &files {
        let doc = read_corpus_file(file)?;
        // Empty files inside a directory are tolerated; they just must not
        // add stray separators.
        if !doc.is_empty() {
            docs.push(doc);
        }
    }
    let corpus = docs.join(DOC_SEPARATOR);
    if corpus.is_empty() {
        return Err(DataError::Empty(path.to_path_buf()));
    }
    Ok(corpus)
}

/// The files of the corpus at `path`: itself, or for a directory every
/// `.txt` and `.jsonl` file inside it, recursively, in sorted path order.
pub fn corpus_files(path: &Path) -> Result<Vec<PathBuf>, DataError> {
    let meta = fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => DataError::NotFound(path.to_path_buf()),
        _ => DataError::io(path, e),
    })?;
    if meta.is_file() {
        if is_parquet(path) {
            return Err(DataError::Parquet(path.to_path_buf()));
        }
        return Ok(vec![path.to_path_buf()]);
    }
    if !meta.is_dir() {
        return Err(DataError::NotAFile(path.to_path_buf()));
    }
    let mut files = Vec::new();
    let mut parquet = 0;
    collect_corpus_files(path, &mut files, &mut parquet)?;
    if files.is_empty() {
        return Err(DataError::NoCorpusFiles {
            path: path.to_path_buf(),
            parquet,
        });
    }
    files.sort();
    Ok(files)
}

/// Whether `path` is a Parquet file: its extension, or the `PAR1` magic its
/// files start with.
pub(crate) fn is_parquet(path: &Path) -> bool {
    if has_extension(path, "parquet") {
        return true;
    }
    let mut magic = [0u8; 4];
    fs::File::open(path)
        .and_then(|mut f| io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| &magic == b"PAR1")
}

pub(crate) fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

/// Recursively gathers `.txt` / `.jsonl` files under `dir`, counting the
/// Parquet files it passes over.
fn collect_corpus_files(
    dir: &Path,
    out: &mut Vec<PathBuf>,
    parquet: &mut usize,
) -> Result<(), DataError> {
    let entries = fs::read_dir(dir).map_err(|e| DataError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| DataError::io(dir, e))?;
        let path = entry.path();
        let file_type = entry.file_type().map_err(|e| DataError::io(&path, e))?;
        if file_type.is_dir() {
            // Only real directories are descended into (`file_type` does not
            // follow symlinks), which rules out symlink cycles.
            collect_corpus_files(&path, out, parquet)?;
            continue;
        }
        if has_extension(&path, "parquet") {
            *parquet += 1;
        }
        if !(has_extension(&path, "txt") || has_extension(&path, "jsonl")) {
            continue;
        }
        // A symlink to a regular file is accepted; a dangling one is reported
        // rather than silently dropped, since the user named it as data.
        let is_file = if file_type.is_symlink() {
            fs::metadata(&path)
                .map_err(|e| DataError::io(&path, e))?
                .is_file()
        } else {
            file_type.is_file()
        };
        if is_file {
            out.push(path);
        }
    }
    Ok(())
}

/// Reads one file as text or JSONL depending on its extension. May return an
/// empty string; callers decide whether that is an error.
pub(crate) fn read_corpus_file(path: &Path) -> Result<String, DataError> {
    let bytes = fs::read(path).map_err(|e| DataError::io(path, e))?;
    let mut text = String::from_utf8(bytes).map_err(|e| DataError::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })?;
    // Editors on Windows may start a UTF-8 file with a byte-order mark: it is
    // not part of the text (and not valid JSON).
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8());
    }
    if has_extension(path, "jsonl") {
        parse_jsonl(path, &text)
    } else {
        Ok(text)
    }
}

fn parse_jsonl(path: &Path, text: &str) -> Result<String, DataError> {
    let mut docs = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|error| DataError::InvalidJson {
                path: path.to_path_buf(),
                line: line_no,
                error,
            })?;
        let doc = value
            .get("text")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| DataError::MissingText {
                path: path.to_path_buf(),
                line: line_no,
            })?;
        if !doc.is_empty() {
            docs.push(doc.to_owned());
        }
    }
    Ok(docs.join(DOC_SEPARATOR))
}

// ---------------------------------------------------------------------------
// Deterministic PRNG
// ---------------------------------------------------------------------------

/// SplitMix64 (Steele, Lea & Flood 2014). Its whole state is one `u64`, which
/// makes checkpointing trivial, and its output is fixed by the algorithm, not
/// by any crate version.
#[derive(Debug, Clone)]
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    fn new(state: u64) -> Self {
        Self { state }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough integer in `0..n` (`n > 0`) via the multiply-high trick;
    /// the bias is at most `n / 2^64`, irrelevant at our sizes. Uses `u128`
    /// rather than `usize` arithmetic so results agree on 32- and 64-bit hosts.
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------
// Built-in corpus
// ---------------------------------------------------------------------------

/// Seed of the built-in corpus. Changing it (or the word lists below) changes
/// the corpus, which the golden-hash test is there to catch.
const DEFAULT_CORPUS_SEED: u64 = 0x5EED_C0A9_0B05_2024;

/// Size the built-in corpus grows to before stopping at a paragraph boundary.
const DEFAULT_CORPUS_TARGET_BYTES: usize = 400_000;

const NAMES: &[&str] = &[
    "Anna", "Ben", "Clara", "David", "Ella", "Finn", "Grace", "Hugo", "Ivy", "Jonas",
];

const PEOPLE: &[&str] = &[
    "the old fisherman",
    "the baker",
    "a young girl",
    "the farmer",
    "my brother",
    "the teacher",
    "a tired soldier",
    "the little boy",
    "the queen",
    "a quiet woman",
    "her mother",
    "the sailor",
];

const ANIMALS: &[&str] = &[
    "the cat",
    "a brown dog",
    "the grey horse",
    "a small fox",
    "the white goose",
    "an old owl",
    "the black bird",
    "a lazy pig",
];

const TRANSITIVE: &[&str] = &[
    "found",
    "carried",
    "painted",
    "watched",
    "lost",
    "opened",
    "cleaned",
    "sold",
    "bought",
    "mended",
    "hid",
    "counted",
    "dropped",
    "kept",
    "wanted",
    "gave away",
];

const INTRANSITIVE: &[&str] = &[
    "slept",
    "sang",
    "waited",
    "laughed",
    "walked home",
    "sat down",
    "ran",
    "danced",
    "worked",
    "rested",
    "cried",
    "looked around",
];

const ADJECTIVES: &[&str] = &[
    "red", "small", "old", "heavy", "wooden", "bright", "broken", "warm", "green", "quiet",
    "little", "shiny", "empty", "blue",
];

const NOUNS: &[&str] = &[
    "box",
    "boat",
    "lamp",
    "basket",
    "letter",
    "coat",
    "key",
    "cup",
    "book",
    "rope",
    "bell",
    "loaf of bread",
    "bag of apples",
    "hat",
    "map",
    "chair",
];

const PLACES: &[&str] = &[
    "near the river",
    "in the garden",
    "at the market",
    "under the old bridge",
    "on the hill",
    "by the sea",
    "in the kitchen",
    "behind the barn",
    "in the forest",
    "at the station",
    "on the road",
    "in the village",
];

const TIMES: &[&str] = &[
    "in the morning",
    "at night",
    "before dinner",
    "after the rain",
    "on Sunday",
    "in the winter",
    "at noon",
    "every evening",
    "the next day",
    "long ago",
];

const FEELINGS: &[&str] = &[
    "happy", "sad", "tired", "angry", "glad", "cold", "hungry", "afraid", "proud", "calm",
];

const QUOTES: &[&str] = &[
    "It is time to go home.",
    "I have never seen such a thing.",
    "The sea is calm today.",
    "We must help them.",
    "Look at the sky!",
    "Where did you put it?",
    "Thank you, my friend.",
    "The bread is still warm.",
    "Do not be afraid.",
    "Tomorrow will be a better day.",
];

/// Fixed lines that recur verbatim, giving the model long exact strings to
/// memorise (a visible sign of learning when sampling).
const REFRAINS: &[&str] = &[
    "And so the days went by, one after another, and the river ran on to the sea.",
    "The wind was soft, the fields were green, and all was well in the village.",
    "That night the stars came out, and everyone slept in peace.",
];

/// Returns a built-in corpus of simple English (about 400 KB, pure ASCII).
///
/// It is generated from a small grammar with a fixed seed, so it is identical
/// on every call and platform, needs no files, and is regular enough that a
/// tiny character-level model visibly learns it within minutes.
pub fn default_corpus() -> String {
    let mut rng = SplitMix64::new(DEFAULT_CORPUS_SEED);
    let mut out = String::with_capacity(DEFAULT_CORPUS_TARGET_BYTES + 4096);
    let mut paragraph = 0usize;
    let mut chapter = 0usize;
    while out.len() < DEFAULT_CORPUS_TARGET_BYTES {
        if paragraph.is_multiple_of(24) {
            chapter += 1;
            out.push_str(&format!("Chapter {chapter}\n\n"));
        }
        let sentences = 3 + rng.below(4);
        for i in 0..sentences {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(&sentence(&mut rng));
        }
        out.push_str("\n\n");
        paragraph += 1;
        if paragraph.is_multiple_of(7) {
            out.push_str(rng.pick(REFRAINS));
            out.push_str("\n\n");
        }
    }
    // No trailing blank line: the corpus ends on text.
    out.truncate(out.trim_end().len());
    out
}

fn subject(rng: &mut SplitMix64) -> String {
    match rng.below(3) {
        0 => rng.pick(NAMES).to_owned(),
        1 => rng.pick(PEOPLE).to_owned(),
        _ => rng.pick(ANIMALS).to_owned(),
    }
}

/// A noun phrase with a correct article, e.g. "an old box" or "the red boat".
fn object(rng: &mut SplitMix64) -> String {
    let adjective = rng.pick(ADJECTIVES);
    let noun = rng.pick(NOUNS);
    let article = match rng.below(3) {
        0 => "the",
        _ if adjective.starts_with(['a', 'e', 'i', 'o', 'u']) => "an",
        _ => "a",
    };
    format!("{article} {adjective} {noun}")
}

fn sentence(rng: &mut SplitMix64) -> String {
    let s = match rng.below(8) {
        0 => format!(
            "{} {} {} {}.",
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng),
            rng.pick(PLACES)
        ),
        1 => format!(
            "{}, {} {} {}.",
            rng.pick(TIMES),
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng)
        ),
        2 => format!(
            "{} {} {} {}.",
            subject(rng),
            rng.pick(INTRANSITIVE),
            rng.pick(PLACES),
            rng.pick(TIMES)
        ),
        3 => format!(
            "{} was {} because {} {} {}.",
            subject(rng),
            rng.pick(FEELINGS),
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng)
        ),
        4 => format!("{} said, \"{}\"", subject(rng), rng.pick(QUOTES)),
        5 => format!(
            "then {} {} {} and {}.",
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng),
            rng.pick(INTRANSITIVE)
        ),
        6 => format!(
            "{} {} {}, but {} {} {}.",
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng),
            subject(rng),
            rng.pick(INTRANSITIVE),
            rng.pick(PLACES)
        ),
        _ => format!(
            "when {} {}, {} {} {} {}.",
            subject(rng),
            rng.pick(INTRANSITIVE),
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng),
            rng.pick(PLACES)
        ),
    };
    capitalize_first(s)
}

fn capitalize_first(mut s: String) -> String {
    if let Some(first) = s.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    s
}

// ---------------------------------------------------------------------------
// Batching
// ---------------------------------------------------------------------------

/// Samples random contiguous windows of a token stream for next-token
/// prediction.
///
/// The generator state is a single `u64` exposed through
/// [`Batcher::rng_state`] / [`Batcher::set_rng_state`], so a checkpoint can
/// store it and a resumed run sees exactly the batches it would have seen.
#[derive(Debug, Clone)]
pub struct Batcher {
    source: Source,
    seq_len: usize,
    rng: SplitMix64,
}

/// What a [`Batcher`] draws from.
#[derive(Debug, Clone)]
enum Source {
    /// A token stream: any window of it.
    Stream(Vec<u32>),
    /// The same, memory-mapped from the token cache.
    Mapped(std::sync::Arc<crate::token_cache::TokenFile>),
    /// Fixed windows with their own targets.
    Windows(Windows),
}

/// Windows of `seq_len` inputs, each with its targets (the next tokens, or
/// [`burn_offload::ops::cross_entropy::IGNORE_INDEX`] where the token is not
/// trained on), row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows {
    pub seq_len: usize,
    pub inputs: Vec<u32>,
    pub targets: Vec<i64>,
    /// Where each window's documents start (the first at 0; attention and
    /// positions stay inside each one): one list per window for packed
    /// instruction data, none at all where a window is one sequence.
    pub starts: Vec<Vec<usize>>,
}

/// Targets of `targets` that are trained on (the others are
/// [`burn_offload::ops::cross_entropy::IGNORE_INDEX`]).
pub fn trained_targets(targets: &[i64]) -> usize {
    targets.iter().filter(|&&t| t >= 0).count()
}

impl Windows {
    /// Number of windows.
    pub fn count(&self) -> usize {
        self.inputs.len() / self.seq_len.max(1)
    }

    /// The windows with at least one trained target, and how many were
    /// dropped for having none.
    pub fn without_untrained(self) -> (Windows, usize) {
        let seq = self.seq_len.max(1);
        let mut kept = Windows {
            seq_len: self.seq_len,
            inputs: Vec::with_capacity(self.inputs.len()),
            targets: Vec::with_capacity(self.targets.len()),
            starts: Vec::new(),
        };
        let mut dropped = 0;
        let windows = self.inputs.chunks(seq).zip(self.targets.chunks(seq));
        for (w, (inputs, targets)) in windows.enumerate() {
            if trained_targets(targets) > 0 {
                kept.inputs.extend_from_slice(inputs);
                kept.targets.extend_from_slice(targets);
                if let Some(starts) = self.starts.get(w) {
                    kept.starts.push(starts.clone());
                }
            } else {
                dropped += 1;
            }
        }
        (kept, dropped)
    }
}

impl Batcher {
    /// Creates a batcher over `tokens` producing windows of `seq_len` tokens.
    ///
    /// Each window needs `seq_len + 1` tokens (inputs plus the shifted
    /// targets), so a shorter corpus is rejected here rather than failing in
    /// the training loop.
    pub fn new(tokens: Vec<u32>, seq_len: usize, seed: u64) -> Result<Self, DataError> {
        Self::stream(tokens.len(), Source::Stream(tokens), seq_len, seed)
    }

    /// [`Batcher::new`] over a tokenized corpus on disk, read where the
    /// windows fall (the corpus is never in memory whole).
    pub fn mapped(
        tokens: crate::token_cache::TokenFile,
        seq_len: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        let len = tokens.len();
        Self::stream(
            len,
            Source::Mapped(std::sync::Arc::new(tokens)),
            seq_len,
            seed,
        )
    }

    /// A batcher over a token stream of `len` tokens, which must hold a window.
    fn stream(len: usize, source: Source, seq_len: usize, seed: u64) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(DataError::ZeroSeqLen);
        }
        if len <= seq_len {
            return Err(DataError::CorpusTooShort {
                tokens: len,
                needed: seq_len.saturating_add(1),
            });
        }
        Ok(Self {
            source,
            seq_len,
            rng: SplitMix64::new(seed),
        })
    }

    /// Creates a batcher drawing whole windows from `windows` (uniformly, with
    /// replacement): instruction data, whose windows carry their own targets.
    pub fn windows(windows: Windows, seed: u64) -> Result<Self, DataError> {
        if windows.count() == 0 {
            return Err(DataError::NoWindows);
        }
        // Checked here, so every batch's boundaries are valid.
        if !windows.starts.is_empty() {
            if windows.starts.len() != windows.count() {
                return Err(DataError::DocumentCount {
                    starts: windows.starts.len(),
                    windows: windows.count(),
                });
            }
            for (window, starts) in windows.starts.iter().enumerate() {
                Documents::new(windows.seq_len, vec![starts.clone()])
                    .map_err(|error| DataError::Documents { window, error })?;
            }
        }
        Ok(Self {
            seq_len: windows.seq_len,
            source: Source::Windows(windows),
            rng: SplitMix64::new(seed),
        })
    }

    /// Returns `(inputs, targets)`, each row-major with shape
    /// `[batch, seq_len]`. Row `r` is the window `tokens[s..s + seq_len]` for
    /// a uniformly random start `s` in `0..=len - seq_len - 1`, and its target
    /// row is the same window shifted one token to the right.
    pub fn next_batch(&mut self, batch: usize) -> (Vec<i64>, Vec<i64>) {
        let (inputs, targets, _) = self.next_batch_in(batch);
        (inputs, targets)
    }

    /// [`Batcher::next_batch`] with the rows' document boundaries, where the
    /// windows carry them (packed instruction data): the same draws.
    pub fn next_batch_in(&mut self, batch: usize) -> (Vec<i64>, Vec<i64>, Option<Documents>) {
        let seq = self.seq_len;
        let n = batch * seq;
        let mut inputs = Vec::with_capacity(n);
        let mut targets = Vec::with_capacity(n);
        let mut starts = Vec::new();
        match &self.source {
            Source::Stream(tokens) => {
                // `new` guarantees len > seq_len, so there is at least one start.
                let starts = (tokens.len() - seq) as u64;
                for _ in 0..batch {
                    let start = self.rng.below(starts) as usize;
                    let window = &tokens[start..start + seq + 1];
                    inputs.extend(window[..seq].iter().map(|&t| i64::from(t)));
                    targets.extend(window[1..].iter().map(|&t| i64::from(t)));
                }
            }
            Source::Mapped(tokens) => {
                let starts = (tokens.len() - seq) as u64;
                for _ in 0..batch {
                    let start = self.rng.below(starts) as usize;
                    inputs.extend((start..start + seq).map(|i| i64::from(tokens.get(i))));
                    targets.extend((start + 1..start + seq + 1).map(|i| i64::from(tokens.get(i))));
                }
            }
            Source::Windows(windows) => {
                for _ in 0..batch {
                    let w = self.rng.below(windows.count() as u64) as usize;
                    let range = w * seq..(w + 1) * seq;
                    inputs.extend(windows.inputs[range.clone()].iter().map(|&t| i64::from(t)));
                    targets.extend_from_slice(&windows.targets[range]);
                    if let Some(s) = windows.starts.get(w) {
                        starts.push(s.clone());
                    }
                }
            }
        }
        // `Batcher::windows` checked each window's starts; a batch of none
        // has no boundaries to keep.
        let documents = (batch > 0 && starts.len() == batch)
            .then(|| Documents::new(seq, starts).ok())
            .flatten();
        (inputs, targets, documents)
    }

    /// Current generator state, for checkpoints.
    pub fn rng_state(&self) -> u64 {
        self.rng.state
    }

    /// Restores a state previously returned by [`Batcher::rng_state`].
    pub fn set_rng_state(&mut self, s: u64) {
        self.rng.state = s;
    }

    /// Number of tokens in the underlying corpus (or windows).
    pub fn len_tokens(&self) -> usize {
        match &self.source {
            Source::Stream(tokens) => tokens.len(),
            Source::Mapped(tokens) => tokens.len(),
            Source::Windows(windows) => windows.inputs.len(),
        }
    }

    /// Window length in tokens.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use tempfile::tempdir;

    fn write(path: &Path, contents: &[u8]) {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create test dir");
        }
        fs::write(path, contents).expect("write test file");
    }

    #[test]
    fn missing_path_is_not_found() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("nope.txt");
        let err = read_corpus(&path).unwrap_err();
        assert!(matches!(err, DataError::NotFound(ref p) if p == &path));
        assert_eq!(
            err.to_string(),
            format!("`{}` does not exist", path.display())
        );
    }

    #[test]
    fn empty_file_is_rejected() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("empty.txt");
        write(&path, b"");
        let err = read_corpus(&path).unwrap_err();
        assert!(matches!(err, DataError::Empty(_)), "{err}");
        assert!(err.to_string().ends_with("is empty"));
    }

    #[test]
    fn directory_without_corpus_files_is_rejected() {
        let dir = tempdir().expect("tempdir");
        write(&dir.path().join("notes.md"), b"not corpus");
        let err = read_corpus(dir.path()).unwrap_err();
        assert!(matches!(err, DataError::NoCorpusFiles { .. }), "{err}");
        assert!(err.to_string().contains("contains no .txt or .jsonl files"));
    }

    #[test]
    fn directory_with_only_empty_files_is_empty() {
        let dir = tempdir().expect("tempdir");
        write(&dir.path().join("a.txt"), b"");
        write(&dir.path().join("b.jsonl"), b"\n\n");
        let err = read_corpus(dir.path()).unwrap_err();
        assert!(matches!(err, DataError::Empty(_)), "{err}");
    }

    #[test]
    fn non_utf8_file_reports_offset() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("bad.txt");
        write(&path, b"abc\xffdef");
        let err = read_corpus(&path).unwrap_err();
        assert!(
            matches!(err, DataError::NotUtf8 { offset: 3, .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "`{}` is not UTF-8 text (invalid byte at offset 3)",
                path.display()
            )
        );
    }

    #[test]
    fn jsonl_without_text_field_reports_line() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("d.jsonl");
        write(&path, b"{\"text\": \"ok\"}\n\n{\"body\": \"no\"}\n");
        let err = read_corpus(&path).unwrap_err();
        assert!(
            matches!(err, DataError::MissingText { line: 3, .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "`{}` line 3: JSON object has no string field `text`",
                path.display()
            )
        );

        // A non-string `text` is the same error.
        write(&path, b"{\"text\": 5}\n");
        let err = read_corpus(&path).unwrap_err();
        assert!(
            matches!(err, DataError::MissingText { line: 1, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn invalid_json_line_reports_line() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("d.jsonl");
        write(&path, b"{\"text\": \"ok\"}\n{\"text\": \n");
        let err = read_corpus(&path).unwrap_err();
        assert!(
            matches!(err, DataError::InvalidJson { line: 2, .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("`{}` line 2: invalid JSON: ", path.display())),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn jsonl_file_joins_documents_and_skips_blank_lines() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("d.jsonl");
        write(
            &path,
            b"{\"text\": \"first\", \"id\": 1}\n   \n{\"text\": \"second\\nline\"}\r\n",
        );
        assert_eq!(read_corpus(&path).expect("read"), "first\n\nsecond\nline");
    }

    #[test]
    fn other_extensions_are_read_as_text() {
        let dir = tempdir().expect("tempdir");
        let path = dir.path().join("input.json");
        write(&path, b"{\"text\": \"raw\"}");
        assert_eq!(read_corpus(&path).expect("read"), "{\"text\": \"raw\"}");
    }

    #[test]
    fn directory_mixes_txt_and_jsonl_in_sorted_order() {
        let dir = tempdir().expect("tempdir");
        write(
            &dir.path().join("b.jsonl"),
            b"{\"text\": \"B1\"}\n{\"text\": \"B2\"}\n",
        );
        write(&dir.path().join("a.txt"), b"A");
        write(&dir.path().join("c.txt"), b"C");
        write(&dir.path().join("sub/d.txt"), b"D");
        write(&dir.path().join("ignored.md"), b"nope");
        write(&dir.path().join("empty.txt"), b"");
        let corpus = read_corpus(dir.path()).expect("read");
        assert_eq!(corpus, "A\n\nB1\n\nB2\n\nC\n\nD");
        assert_eq!(read_corpus(dir.path()).expect("read again"), corpus);
    }

    #[test]
    fn errors_inside_directory_name_the_file() {
        let dir = tempdir().expect("tempdir");
        write(&dir.path().join("a.txt"), b"fine");
        let bad = dir.path().join("b.txt");
        write(&bad, b"\xc3");
        let err = read_corpus(dir.path()).unwrap_err();
        assert!(matches!(err, DataError::NotUtf8 { ref path, offset: 0 } if path == &bad));
    }

    /// FNV-1a, used to pin the exact bytes of the built-in corpus.
    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }

    #[test]
    fn default_corpus_is_deterministic_ascii_and_sized() {
        let a = default_corpus();
        let b = default_corpus();
        assert_eq!(a, b);
        assert!(a.is_ascii());
        assert!(
            (300_000..=500_000).contains(&a.len()),
            "size {} out of range",
            a.len()
        );
        assert!(a.starts_with("Chapter 1\n\n"));
        assert!(!a.ends_with('\n'));
        // The corpus uses a small alphabet, so a byte model has little to learn
        // beyond the grammar.
        let distinct: std::collections::BTreeSet<u8> = a.bytes().collect();
        assert!(distinct.len() < 80, "{} distinct bytes", distinct.len());
        for refrain in REFRAINS {
            assert!(a.contains(refrain));
        }
    }

    #[test]
    fn default_corpus_golden() {
        // Pins the exact output: if this fails, the corpus changed, which
        // silently changes every training run that uses it.
        let corpus = default_corpus();
        assert_eq!(
            (corpus.len(), fnv1a(corpus.as_bytes())),
            (400_076, 0x77F0_28DD_9953_52F8)
        );
    }

    #[test]
    fn splitmix64_reference_values() {
        // Reference outputs of SplitMix64 seeded with 0, from the published
        // algorithm; guards against accidental edits of the constants.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn batcher_rejects_short_corpus_and_zero_seq_len() {
        let err = Batcher::new(vec![1, 2, 3, 4], 4, 0).unwrap_err();
        assert!(matches!(
            err,
            DataError::CorpusTooShort {
                tokens: 4,
                needed: 5
            }
        ));
        assert_eq!(
            err.to_string(),
            "corpus has 4 tokens but a window needs seq_len + 1 = 5 tokens"
        );
        assert!(matches!(
            Batcher::new(vec![1, 2], 0, 0),
            Err(DataError::ZeroSeqLen)
        ));
        // Exactly seq_len + 1 tokens is enough: one possible window.
        let mut b = Batcher::new(vec![1, 2, 3, 4, 5], 4, 0).expect("batcher");
        assert_eq!(
            b.next_batch(2),
            (vec![1, 2, 3, 4, 1, 2, 3, 4], vec![2, 3, 4, 5, 2, 3, 4, 5])
        );
    }

    /// Packed windows hand each drawn row's document starts to the batch
    /// (the rows' first tokens say which window was drawn); bad starts are
    /// refused when the batcher is made.
    #[test]
    fn window_batches_carry_their_rows_documents() {
        let windows = Windows {
            seq_len: 4,
            inputs: vec![10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33],
            targets: vec![1; 12],
            starts: vec![vec![0, 2], vec![0], vec![0, 1, 3]],
        };
        let mut b = Batcher::windows(windows.clone(), 5).expect("batcher");
        for _ in 0..10 {
            let (x, _, documents) = b.next_batch_in(3);
            let documents = documents.expect("packed windows have boundaries");
            for row in 0..3 {
                let w = (x[row * 4] / 10 - 1) as usize;
                assert_eq!(documents.starts(row), windows.starts[w]);
            }
        }
        let plain = Windows {
            starts: Vec::new(),
            ..windows.clone()
        };
        let (_, _, none) = Batcher::windows(plain, 5).unwrap().next_batch_in(2);
        assert!(none.is_none());
        for starts in [vec![vec![0]], vec![vec![0], vec![0], vec![1]]] {
            let bad = Windows {
                starts,
                ..windows.clone()
            };
            assert!(Batcher::windows(bad, 5).is_err());
        }
    }

    #[test]
    fn batcher_is_deterministic_and_resumable() {
        let tokens: Vec<u32> = (0..1000).map(|i| (i * 7 % 256) as u32).collect();
        let mut a = Batcher::new(tokens.clone(), 16, 42).expect("batcher");
        let mut b = Batcher::new(tokens.clone(), 16, 42).expect("batcher");
        for _ in 0..5 {
            assert_eq!(a.next_batch(4), b.next_batch(4));
        }
        let mut c = Batcher::new(tokens.clone(), 16, 43).expect("batcher");
        assert_ne!(a.next_batch(4), c.next_batch(4));

        // Restoring a saved state reproduces the following batches exactly.
        let saved = a.rng_state();
        let expected: Vec<_> = (0..3).map(|_| a.next_batch(8)).collect();
        let mut resumed = Batcher::new(tokens, 16, 0).expect("batcher");
        resumed.set_rng_state(saved);
        let got: Vec<_> = (0..3).map(|_| resumed.next_batch(8)).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn batcher_windows_are_shifted_and_in_range() {
        // Token value == position, so each row must be consecutive integers.
        let len = 100usize;
        let seq_len = 10usize;
        let tokens: Vec<u32> = (0..len as u32).collect();
        let mut b = Batcher::new(tokens, seq_len, 7).expect("batcher");
        assert_eq!(b.len_tokens(), len);
        assert_eq!(b.seq_len(), seq_len);
        let mut seen_first = false;
        let mut seen_last = false;
        for _ in 0..200 {
            let batch = 8;
            let (x, y) = b.next_batch(batch);
            assert_eq!(x.len(), batch * seq_len);
            assert_eq!(y.len(), batch * seq_len);
            for (xr, yr) in x.chunks(seq_len).zip(y.chunks(seq_len)) {
                let start = xr[0];
                assert!(start >= 0 && (start as usize) < len - seq_len);
                for j in 0..seq_len {
                    assert_eq!(xr[j], start + j as i64);
                    assert_eq!(yr[j], xr[j] + 1);
                }
                seen_first |= start == 0;
                seen_last |= start as usize == len - seq_len - 1;
            }
        }
        // 1600 draws over 90 starts: both ends are hit with overwhelming
        // probability (and deterministically for this seed).
        assert!(seen_first && seen_last);
        assert_eq!(b.next_batch(0), (vec![], vec![]));
    }
}
