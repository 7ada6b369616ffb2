//! Held-out evaluation data: the windows a run evaluates on, in a fixed
//! order, apart from the batcher, so evaluating never changes what the run
//! trains on. A text stream is cut into consecutive windows; instruction
//! windows keep their own targets and document starts.

use std::sync::Arc;

use burn::prelude::{Backend, Int, Tensor, TensorData};
use burn_offload::Documents;

use super::batcher::{trained_targets, Windows};
use super::error::DataError;
use super::rng::SplitMix64;
use super::token_cache::TokenFile;

/// The evaluation windows of a run.
#[derive(Debug, Clone)]
pub struct EvalWindows {
    source: Source,
    seq_len: usize,
}

/// Tokens of a stream: in memory, or mapped from the token cache.
#[derive(Debug, Clone)]
enum Tokens {
    Owned(Arc<Vec<u32>>),
    Mapped(Arc<TokenFile>),
}

impl Tokens {
    fn get(&self, i: usize) -> u32 {
        match self {
            Tokens::Owned(tokens) => tokens[i],
            Tokens::Mapped(tokens) => tokens.get(i),
        }
    }

    fn len(&self) -> usize {
        match self {
            Tokens::Owned(tokens) => tokens.len(),
            Tokens::Mapped(tokens) => tokens.len(),
        }
    }
}

#[derive(Debug, Clone)]
enum Source {
    /// Consecutive windows of `tokens[start..]`, each target the next token.
    Stream { tokens: Tokens, start: usize },
    /// Fixed windows with their own targets.
    Windows(Windows),
}

/// One batch of evaluation windows, row-major `[rows, seq_len]`.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalBatch {
    pub rows: usize,
    pub inputs: Vec<i64>,
    pub targets: Vec<i64>,
    /// The rows' document boundaries (packed instruction windows).
    pub documents: Option<Documents>,
}

/// Tokens of a stream of `len` that `fraction` holds out at its end: at
/// least one window's `seq_len + 1`, leaving a window's to train on.
pub fn held_out_tokens(len: usize, fraction: f64, seq_len: usize) -> Result<usize, DataError> {
    let held = (len as f64 * fraction).round() as usize;
    let needed = seq_len.saturating_add(1);
    if held < needed {
        return Err(DataError::EvalSplitTooSmall {
            fraction,
            held,
            total: len,
            needed,
        });
    }
    if len - held < needed {
        return Err(DataError::EvalSplitLeavesNothing { fraction });
    }
    Ok(held)
}

/// `windows` split into (training, evaluation) windows: `fraction` of them
/// (at least one), chosen by a fixed shuffle, so the held-out examples are
/// spread over the data, and the same in every run of the same data.
pub fn split_windows(windows: Windows, fraction: f64) -> Result<(Windows, Windows), DataError> {
    let count = windows.count();
    let held = ((count as f64 * fraction).round() as usize).max(1);
    if held >= count {
        return Err(DataError::EvalSplitLeavesNothing { fraction });
    }
    let mut order: Vec<usize> = (0..count).collect();
    // Fisher-Yates, seeded by a constant: the split is the data's, not the run's.
    let mut rng = SplitMix64::new(0x5EED_E7A1);
    for i in (1..count).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut is_held = vec![false; count];
    for &w in &order[..held] {
        is_held[w] = true;
    }
    let empty = || Windows {
        seq_len: windows.seq_len,
        inputs: Vec::new(),
        targets: Vec::new(),
        starts: Vec::new(),
    };
    let (mut train, mut eval) = (empty(), empty());
    let seq = windows.seq_len;
    for (w, &held) in is_held.iter().enumerate() {
        let into = if held { &mut eval } else { &mut train };
        into.inputs
            .extend_from_slice(&windows.inputs[w * seq..(w + 1) * seq]);
        into.targets
            .extend_from_slice(&windows.targets[w * seq..(w + 1) * seq]);
        if let Some(starts) = windows.starts.get(w) {
            into.starts.push(starts.clone());
        }
    }
    Ok((train, eval))
}

impl EvalBatch {
    /// The inputs and targets as `[rows, seq_len]` tensors on `device`.
    pub fn tensors<B: Backend>(&self, device: &B::Device) -> [Tensor<B, 2, Int>; 2] {
        let shape = [self.rows, self.inputs.len() / self.rows.max(1)];
        [&self.inputs, &self.targets]
            .map(|v| Tensor::from_data(TensorData::new(v.clone(), shape), device))
    }
}

impl EvalWindows {
    /// Consecutive windows of `tokens` (in memory).
    pub fn stream(tokens: Vec<u32>, seq_len: usize) -> Result<Self, DataError> {
        Self::of_stream(Tokens::Owned(Arc::new(tokens)), 0, seq_len)
    }

    /// Consecutive windows of the mapped `tokens` from `start` to its end.
    pub fn mapped(tokens: Arc<TokenFile>, start: usize, seq_len: usize) -> Result<Self, DataError> {
        Self::of_stream(Tokens::Mapped(tokens), start, seq_len)
    }

    fn of_stream(tokens: Tokens, start: usize, seq_len: usize) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(DataError::ZeroSeqLen);
        }
        let held = tokens.len().saturating_sub(start);
        if held <= seq_len {
            return Err(DataError::CorpusTooShort {
                tokens: held,
                needed: seq_len + 1,
            });
        }
        Ok(Self {
            source: Source::Stream { tokens, start },
            seq_len,
        })
    }

    /// Instruction windows, each with its own targets (those with none
    /// trained on count for nothing, and are left out).
    pub fn windows(windows: Windows) -> Result<Self, DataError> {
        let (windows, _) = windows.without_untrained();
        if windows.count() == 0 {
            return Err(DataError::NoWindows);
        }
        Ok(Self {
            seq_len: windows.seq_len,
            source: Source::Windows(windows),
        })
    }

    /// Number of windows.
    pub fn count(&self) -> usize {
        match &self.source {
            // Consecutive windows, each needing one more token for its last target.
            Source::Stream { tokens, start } => (tokens.len() - start - 1) / self.seq_len,
            Source::Windows(windows) => windows.count(),
        }
    }

    /// Targets the loss is taken over, in every window.
    pub fn trained(&self) -> usize {
        match &self.source {
            Source::Stream { .. } => self.count() * self.seq_len,
            Source::Windows(windows) => trained_targets(&windows.targets),
        }
    }

    /// The windows of rank `rank` of `world` (every `world`-th, from
    /// `rank`), in batches of at most `batch` rows.
    pub fn batches(
        &self,
        batch: usize,
        rank: usize,
        world: usize,
    ) -> impl Iterator<Item = EvalBatch> + '_ {
        let mine: Vec<usize> = (rank..self.count()).step_by(world.max(1)).collect();
        let chunks: Vec<Vec<usize>> = mine.chunks(batch.max(1)).map(<[usize]>::to_vec).collect();
        chunks.into_iter().map(move |rows| self.batch(&rows))
    }

    fn batch(&self, rows: &[usize]) -> EvalBatch {
        let seq = self.seq_len;
        let mut inputs = Vec::with_capacity(rows.len() * seq);
        let mut targets = Vec::with_capacity(rows.len() * seq);
        let mut starts = Vec::new();
        for &w in rows {
            match &self.source {
                Source::Stream { tokens, start, .. } => {
                    let first = start + w * seq;
                    inputs.extend((first..first + seq).map(|i| i64::from(tokens.get(i))));
                    targets.extend((first + 1..first + seq + 1).map(|i| i64::from(tokens.get(i))));
                }
                Source::Windows(windows) => {
                    let range = w * seq..(w + 1) * seq;
                    inputs.extend(windows.inputs[range.clone()].iter().map(|&t| i64::from(t)));
                    targets.extend_from_slice(&windows.targets[range]);
                    if let Some(s) = windows.starts.get(w) {
                        starts.push(s.clone());
                    }
                }
            }
        }
        // `Batcher::windows`' checks hold for the same windows.
        let documents = (starts.len() == rows.len())
            .then(|| Documents::new(seq, starts).ok())
            .flatten();
        EvalBatch {
            rows: rows.len(),
            inputs,
            targets,
            documents,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's windows are consecutive, each target the next token, the
    /// ranks share them without overlap, and a batch holds at most `batch`.
    #[test]
    fn stream_windows_cover_the_held_out_tokens_once() {
        let tokens: Vec<u32> = (0..23).collect();
        let eval = EvalWindows::stream(tokens, 5).unwrap();
        assert_eq!(eval.count(), 4);
        assert_eq!(eval.trained(), 20);
        let all: Vec<EvalBatch> = eval.batches(3, 0, 1).collect();
        assert_eq!(all.iter().map(|b| b.rows).collect::<Vec<_>>(), [3, 1]);
        assert_eq!(&all[0].inputs[..6], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(&all[0].targets[..6], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(all[1].targets, [16, 17, 18, 19, 20]);
        let firsts = |rank| -> Vec<i64> {
            eval.batches(8, rank, 2)
                .flat_map(|b| b.inputs.chunks(5).map(|w| w[0]).collect::<Vec<_>>())
                .collect()
        };
        assert_eq!((firsts(0), firsts(1)), (vec![0, 10], vec![5, 15]));
    }

    /// A split holds out the asked share of the windows, at least one, the
    /// same every time, keeping each window's starts; nothing left to train
    /// on, or too little held out of a stream, is refused.
    #[test]
    fn splits_are_fixed_and_refuse_what_leaves_nothing() {
        let windows = Windows {
            seq_len: 2,
            inputs: (0..20).collect(),
            targets: (0..20).collect(),
            starts: (0..10).map(|w| vec![0, w % 2]).collect(),
        };
        let (train, eval) = split_windows(windows.clone(), 0.3).unwrap();
        assert_eq!((train.count(), eval.count()), (7, 3));
        assert_eq!(split_windows(windows.clone(), 0.3).unwrap().1, eval);
        for (inputs, starts) in eval.inputs.chunks(2).zip(&eval.starts) {
            assert_eq!(starts, &vec![0, (inputs[0] as usize / 2) % 2]);
        }
        assert_eq!(split_windows(windows.clone(), 0.01).unwrap().1.count(), 1);
        assert!(split_windows(windows, 0.99).is_err());
        assert_eq!(held_out_tokens(1000, 0.1, 64).unwrap(), 100);
        assert!(held_out_tokens(1000, 0.05, 64).is_err());
        assert!(held_out_tokens(100, 0.5, 64).is_err());
    }
}
