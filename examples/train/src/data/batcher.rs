//! The seeded random-window batcher: windows of a token stream (in memory or
//! mapped from the token cache), or fixed windows with their own targets.

use burn_offload::Documents;

use super::error::DataError;
use super::rng::SplitMix64;
use super::token_cache::TokenFile;

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
    /// The same, memory-mapped from the token cache: its first tokens, as
    /// many as the number says (the others held out).
    Mapped(std::sync::Arc<TokenFile>, usize),
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

    /// [`Batcher::new`] over the first `len` tokens of a tokenized corpus
    /// on disk, read where the windows fall (the corpus is never in memory
    /// whole).
    pub fn mapped(
        tokens: std::sync::Arc<TokenFile>,
        len: usize,
        seq_len: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        let len = len.min(tokens.len());
        Self::stream(len, Source::Mapped(tokens, len), seq_len, seed)
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
            Source::Mapped(tokens, len) => {
                let starts = (len - seq) as u64;
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
            Source::Mapped(_, len) => *len,
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
