//! The embedding-table rows a batch of tokens reads, for the engine's lookup
//! on the host side of the bus (DESIGN.md §1, phase 4 and the forward's
//! embedding).
//!
//! A batch of 64k tokens reads a few hundred distinct rows with a byte
//! tokenizer, a few thousand with a BPE one. So the forward uploads only
//! those rows and the device picks each position's (instead of the host
//! copying 64k rows and the bus carrying them), and on CUDA the backward sums
//! each row's positions of `dy` on the device, in segments of at most
//! [`SEGMENT`] positions, and downloads only the sums (instead of all of
//! `dy`, added into the table on the host). Both lie on the path from the
//! last block's backward to the next step's first kernel, where the device
//! idles: at 64k tokens of the 0.85B Llama that host work took ~36 ms in
//! run28 call 1's trace and ~14 ms in call 2's.

use rayon::prelude::*;

/// Most positions one device sum covers: a frequent token's positions (a
/// byte tokenizer's space: a sixth of them) are split so that no one unit
/// sums them all.
pub(crate) const SEGMENT: usize = 64;

/// The distinct tokens of a batch and where each position's row sits among them.
pub(crate) struct TokenRows {
    /// The distinct tokens, ascending: the table rows the batch reads.
    pub rows: Vec<i64>,
    /// Per position, the index of its token in `rows`.
    pub index: Vec<i32>,
    /// The positions grouped by token (in `rows`' order), each group in
    /// position order (read by the device sums, on CUDA).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub order: Vec<i32>,
    /// Segment `s` sums the positions `order[starts[s]..starts[s + 1]]`, all
    /// of one token, `rows[segment_row[s]]`; a token's segments are consecutive.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub starts: Vec<i32>,
    pub segment_row: Vec<usize>,
}

impl TokenRows {
    /// The rows of `tokens`, each in `0..table_rows` (checked by the caller).
    pub fn new(tokens: &[i64], table_rows: usize) -> Self {
        // Counting sort: the positions of token t are grouped in token order.
        let mut counts = vec![0usize; table_rows];
        for &t in tokens {
            counts[t as usize] += 1;
        }
        let mut slot = vec![0usize; table_rows];
        let (mut rows, mut offsets) = (Vec::new(), Vec::new());
        let mut at = 0;
        for (t, &n) in counts.iter().enumerate() {
            if n > 0 {
                slot[t] = rows.len();
                rows.push(t as i64);
                offsets.push(at);
                at += n;
            }
        }
        let mut next = offsets.clone();
        let mut order = vec![0i32; tokens.len()];
        let mut index = Vec::with_capacity(tokens.len());
        for (p, &t) in tokens.iter().enumerate() {
            let u = slot[t as usize];
            index.push(u as i32);
            order[next[u]] = p as i32;
            next[u] += 1;
        }
        let (mut starts, mut segment_row) = (vec![0i32], Vec::new());
        for (u, &first) in offsets.iter().enumerate() {
            let end = next[u];
            let mut start = first;
            while start < end {
                start = (start + SEGMENT).min(end);
                starts.push(start as i32);
                segment_row.push(u);
            }
        }
        Self {
            rows,
            index,
            order,
            starts,
            segment_row,
        }
    }

    /// Number of device sums.
    pub fn segments(&self) -> usize {
        self.segment_row.len()
    }

    /// Adds the segment sums `sums` (`[segments, width]`) into the rows of
    /// `table` (`[table_rows, width]`): each row's segments in order, one
    /// thread per row, so the sums come out the same on every run.
    pub fn add_sums(&self, table: &mut [f32], width: usize, sums: &[f32]) {
        assert_eq!(sums.len(), self.segments() * width, "one sum per segment");
        // The first segment of each distinct row.
        let mut first = Vec::with_capacity(self.rows.len() + 1);
        for (s, &u) in self.segment_row.iter().enumerate() {
            if first.len() == u {
                first.push(s);
            }
        }
        first.push(self.segments());
        // Per table row, its index among the distinct rows.
        let mut distinct = vec![None; table.len() / width];
        for (u, &t) in self.rows.iter().enumerate() {
            distinct[t as usize] = Some(u);
        }
        table
            .par_chunks_mut(width)
            .zip(distinct.par_iter())
            .filter_map(|(row, u)| u.map(|u| (u, row)))
            .for_each(|(u, row)| {
                for s in first[u]..first[u + 1] {
                    let sum = &sums[s * width..(s + 1) * width];
                    row.iter_mut().zip(sum).for_each(|(o, v)| *o += v);
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_grouped_by_token_and_split_into_segments() {
        // Token 3 at 70 positions (two segments), token 1 at 2, token 5 at 1.
        let mut tokens = vec![3i64; 70];
        tokens[10] = 1;
        tokens[40] = 5;
        tokens[69] = 1;
        let rows = TokenRows::new(&tokens, 8);
        assert_eq!(rows.rows, [1, 3, 5]);
        assert_eq!(rows.index[10], 0);
        assert_eq!(rows.index[0], 1);
        assert_eq!(rows.index[40], 2);
        assert_eq!(&rows.order[..2], [10, 69]);
        assert_eq!(rows.order[2], 0);
        assert_eq!(rows.order.len(), 70);
        // 2 positions of token 1; 67 of token 3 in 64 + 3; 1 of token 5.
        assert_eq!(rows.starts, [0, 2, 66, 69, 70]);
        assert_eq!(rows.segment_row, [0, 1, 1, 2]);
    }

    #[test]
    fn segment_sums_add_up_to_the_scatter_of_every_position() {
        let width = 3;
        let tokens: Vec<i64> = (0..200).map(|p| [2, 0, 2, 4, 2][p % 5]).collect();
        let values: Vec<f32> = (0..200 * width).map(|i| (i % 17) as f32 - 8.0).collect();
        let rows = TokenRows::new(&tokens, 6);
        // The device's sums, on the host: each segment's positions in order.
        let mut sums = vec![0.0f32; rows.segments() * width];
        for s in 0..rows.segments() {
            for k in rows.starts[s]..rows.starts[s + 1] {
                let p = rows.order[k as usize] as usize;
                for c in 0..width {
                    sums[s * width + c] += values[p * width + c];
                }
            }
        }
        let mut table = vec![1.0f32; 6 * width];
        rows.add_sums(&mut table, width, &sums);
        let mut want = vec![1.0f32; 6 * width];
        crate::pager::scatter_add_rows(&mut want, width, &tokens, &values).expect("in range");
        assert_eq!(table, want);
    }
}
