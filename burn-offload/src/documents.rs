//! Document boundaries of packed windows: which positions of a batch row
//! belong to which document, so that attention never crosses a boundary and
//! positions count from each document's start.
//!
//! One representation, the sorted start positions of each row's documents,
//! read three ways: per-position segment ids (a mask compares them), each
//! position's offset in its document (rotary `position_ids`, as Hugging Face
//! builds them for packed sequences) and the cumulative lengths over the
//! rows laid end to end (`cu_seqlens`, what FlashAttention's varlen entry
//! points and cuDNN's ragged sequences take).

use std::ops::Range;

use thiserror::Error;

/// Why document boundaries were refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DocumentsError {
    /// A row's starts do not begin at 0, rise strictly and stay inside it.
    #[error(
        "row {row}: document starts {starts:?} must begin at 0, rise strictly and stay below \
         the row's {seq} positions"
    )]
    Starts {
        /// The row.
        row: usize,
        /// Its starts as given.
        starts: Vec<usize>,
        /// Positions per row.
        seq: usize,
    },
    /// A row of no positions holds no document.
    #[error("documents of rows of 0 positions")]
    Empty,
    /// Rows asked for beyond the batch.
    #[error("rows {rows:?} of a batch of {batch}")]
    Rows {
        /// The rows asked for.
        rows: Range<usize>,
        /// Rows in the batch.
        batch: usize,
    },
}

/// The documents packed into each row of a `[batch, seq]` batch: per row,
/// the sorted positions where its documents start (the first at 0). A
/// document runs to the next start or the end of the row; padding after the
/// last example is best given a start of its own, so no example sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Documents {
    seq: usize,
    starts: Vec<Vec<usize>>,
}

impl Documents {
    /// Rows of `seq` positions with the documents starting at `starts[row]`.
    ///
    /// # Errors
    /// If `seq` is 0, or a row's starts do not begin at 0, rise strictly
    /// and stay below `seq`.
    pub fn new(seq: usize, starts: Vec<Vec<usize>>) -> Result<Self, DocumentsError> {
        if seq == 0 {
            return Err(DocumentsError::Empty);
        }
        for (row, s) in starts.iter().enumerate() {
            let rising = s.windows(2).all(|w| w[0] < w[1]);
            if s.first() != Some(&0) || !rising || s.last().is_some_and(|&l| l >= seq) {
                return Err(DocumentsError::Starts {
                    row,
                    starts: s.clone(),
                    seq,
                });
            }
        }
        Ok(Self { seq, starts })
    }

    /// One document a row: what attention and positions are without
    /// boundaries.
    pub fn whole(batch: usize, seq: usize) -> Self {
        Self {
            seq: seq.max(1),
            starts: vec![vec![0]; batch],
        }
    }

    /// `[batch, seq]`, the shape of the tokens these boundaries are for.
    pub fn dims(&self) -> [usize; 2] {
        [self.starts.len(), self.seq]
    }

    /// Rows in the batch.
    pub fn batch(&self) -> usize {
        self.starts.len()
    }

    /// Positions per row.
    pub fn seq(&self) -> usize {
        self.seq
    }

    /// Where `row`'s documents start, from 0.
    pub fn starts(&self, row: usize) -> &[usize] {
        &self.starts[row]
    }

    /// Whether every row is one document: nothing to mask, positions count
    /// from 0 (the paths without boundaries run, unchanged).
    pub fn is_whole(&self) -> bool {
        self.starts.iter().all(|s| s.len() == 1)
    }

    /// The start of the document holding position `pos` of `row`.
    pub fn start_of(&self, row: usize, pos: usize) -> usize {
        let starts = &self.starts[row];
        starts[starts.partition_point(|&s| s <= pos) - 1]
    }

    /// The earliest start, over the rows, of the documents holding position
    /// `pos`: no query at `pos` or later, in any row, sees a key before it.
    pub fn earliest_start_at(&self, pos: usize) -> usize {
        (0..self.batch())
            .map(|row| self.start_of(row, pos))
            .min()
            .unwrap_or(0)
    }

    /// Each position's document, numbered from 0 in its row:
    /// `[batch · seq]`, row-major. Two positions of a row see each other
    /// only where their ids are equal.
    pub fn segment_ids(&self) -> Vec<i64> {
        self.per_position(|doc, _| doc as i64)
    }

    /// Each position's offset from its document's start, `[batch · seq]`,
    /// row-major: the rotary `position_ids` of a packed row.
    pub fn positions(&self) -> Vec<i64> {
        self.per_position(|_, offset| offset as i64)
    }

    /// The longest document's length: positions run below it.
    pub fn longest(&self) -> usize {
        self.starts
            .iter()
            .flat_map(|s| {
                s.iter()
                    .zip(s.iter().skip(1).chain(std::iter::once(&self.seq)))
                    .map(|(a, b)| b - a)
            })
            .max()
            .unwrap_or(0)
    }

    /// Cumulative document lengths over the rows laid end to end, from 0 to
    /// `batch · seq` (FlashAttention's `cu_seqlens`, cuDNN's ragged offsets).
    pub fn cu_seqlens(&self) -> Vec<i32> {
        let mut cu: Vec<i32> = self
            .starts
            .iter()
            .enumerate()
            .flat_map(|(row, s)| s.iter().map(move |&start| (row * self.seq + start) as i32))
            .collect();
        cu.push((self.batch() * self.seq) as i32);
        cu
    }

    /// The boundaries of `rows` (a micro-batch cut from a batch).
    ///
    /// # Errors
    /// If `rows` reaches past the batch.
    pub fn rows(&self, rows: Range<usize>) -> Result<Self, DocumentsError> {
        match self.starts.get(rows.clone()) {
            Some(starts) => Ok(Self {
                seq: self.seq,
                starts: starts.to_vec(),
            }),
            None => Err(DocumentsError::Rows {
                rows,
                batch: self.batch(),
            }),
        }
    }

    fn per_position(&self, f: impl Fn(usize, usize) -> i64) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.batch() * self.seq);
        for starts in &self.starts {
            for (doc, &start) in starts.iter().enumerate() {
                let end = starts.get(doc + 1).copied().unwrap_or(self.seq);
                out.extend((0..end - start).map(|offset| f(doc, offset)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_set_of_starts_reads_as_ids_positions_and_cumulative_lengths() {
        let docs = Documents::new(5, vec![vec![0, 2], vec![0], vec![0, 1, 4]]).unwrap();
        assert_eq!(docs.dims(), [3, 5]);
        assert!(!docs.is_whole());
        assert_eq!(
            docs.segment_ids(),
            [0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2]
        );
        assert_eq!(
            docs.positions(),
            [0, 1, 0, 1, 2, 0, 1, 2, 3, 4, 0, 0, 1, 2, 0]
        );
        assert_eq!(docs.cu_seqlens(), [0, 2, 5, 10, 11, 14, 15]);
        assert_eq!(docs.longest(), 5);
        assert_eq!((docs.start_of(0, 1), docs.start_of(0, 4)), (0, 2));
        assert_eq!(docs.earliest_start_at(4), 0);
        assert_eq!(docs.rows(2..3).unwrap().starts(0), [0, 1, 4]);
        assert!(docs.rows(2..4).is_err());
        assert!(Documents::whole(2, 3).is_whole());
        assert_eq!(Documents::whole(2, 3).positions(), [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn starts_must_open_at_zero_rise_and_stay_in_the_row() {
        for bad in [vec![], vec![1], vec![0, 0], vec![0, 3, 2], vec![0, 5]] {
            assert!(
                matches!(
                    Documents::new(5, vec![vec![0], bad.clone()]),
                    Err(DocumentsError::Starts { row: 1, .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(Documents::new(0, vec![]), Err(DocumentsError::Empty));
    }
}
