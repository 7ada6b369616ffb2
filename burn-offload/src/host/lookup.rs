//! The embedding-table rows a batch of tokens reads, for the engine's lookup
//! on the host side of the bus (docs/ARCHITECTURE.md §2, phase 4 and the forward's
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
//! idles. Elsewhere the host adds `dy`'s rows into the table itself
//! ([`scatter_add_rows`]), over the same grouping of positions by token.

use rayon::prelude::*;

/// Most positions one device sum covers: a frequent token's positions (a
/// byte tokenizer's space: a sixth of them) are split so that no one unit
/// sums them all.
pub const SEGMENT: usize = 64;

/// The distinct tokens of a batch and where each position's row sits among them.
pub struct TokenRows {
    /// The distinct tokens, ascending: the table rows the batch reads.
    pub rows: Vec<i64>,
    /// Per position, the index of its token in `rows`.
    pub index: Vec<i32>,
    /// The positions grouped by token (in `rows`' order), each group in
    /// position order (read by the device sums, on CUDA).
    pub order: Vec<i32>,
    /// The positions of `rows[u]` are `order[bounds[u]..bounds[u + 1]]`.
    pub bounds: Vec<usize>,
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
        let mut bounds = offsets;
        bounds.push(tokens.len());
        Self {
            rows,
            index,
            order,
            bounds,
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

/// Adds row `p` of `values` (`[tokens.len(), width]`) into row `tokens[p]`
/// of `table` (`[rows, width]`) for every position `p`: the gradient of a
/// row lookup. Positions are grouped by token ([`TokenRows`], in order) and
/// each table row goes to one thread whole, so no two threads write a row
/// and the sums come out the same on every run. A token outside `0..rows` is
/// returned as the error, before anything is written.
pub fn scatter_add_rows(
    table: &mut [f32],
    width: usize,
    tokens: &[i64],
    values: &[f32],
) -> Result<(), i64> {
    assert!(width > 0 && table.len().is_multiple_of(width), "table rows");
    assert_eq!(values.len(), tokens.len() * width, "one row per token");
    let rows = table.len() / width;
    check_tokens(tokens, rows)?;
    let grouped = TokenRows::new(tokens, rows);
    let mut distinct = vec![None; rows];
    for (u, &t) in grouped.rows.iter().enumerate() {
        distinct[t as usize] = Some(u);
    }
    // A row's columns are split too: a frequent token's row (a byte
    // tokenizer's space: a sixth of all positions) would otherwise be one
    // thread's serial sum. Each element still adds its positions in order.
    const COLUMNS: usize = 256;
    table
        .par_chunks_mut(width)
        .zip(distinct.par_iter())
        .filter_map(|(row, u)| u.map(|u| (u, row)))
        .for_each(|(u, row)| {
            let positions = &grouped.order[grouped.bounds[u]..grouped.bounds[u + 1]];
            row.par_chunks_mut(COLUMNS)
                .enumerate()
                .for_each(|(c, cols)| {
                    let first = c * COLUMNS;
                    for &p in positions {
                        let at = p as usize * width + first;
                        let value = &values[at..at + cols.len()];
                        cols.iter_mut().zip(value).for_each(|(o, v)| *o += v);
                    }
                });
        });
    Ok(())
}

/// The first token outside `0..rows`, as the error.
pub fn check_tokens(tokens: &[i64], rows: usize) -> Result<(), i64> {
    match tokens.iter().find(|&&t| t < 0 || t as usize >= rows) {
        Some(&bad) => Err(bad),
        None => Ok(()),
    }
}

/// Copies row `tokens[p]` of `table` (`[rows, width]`) into row `p` of `out`:
/// a lookup in an embedding table. A token outside `0..rows` is returned as
/// the error, before anything is written.
pub fn gather_rows(
    table: &[f32],
    width: usize,
    tokens: &[i64],
    out: &mut [f32],
) -> Result<(), i64> {
    assert!(width > 0 && table.len().is_multiple_of(width), "table rows");
    assert_eq!(out.len(), tokens.len() * width, "one row per token");
    check_tokens(tokens, table.len() / width)?;
    out.par_chunks_mut(width)
        .zip(tokens.par_iter())
        .for_each(|(row, &t)| {
            let t = t as usize;
            row.copy_from_slice(&table[t * width..(t + 1) * width]);
        });
    Ok(())
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
        scatter_add_rows(&mut want, width, &tokens, &values).expect("in range");
        assert_eq!(table, want);
    }

    #[test]
    fn scatter_add_rows_sums_the_rows_of_each_token_into_its_row() {
        let width = 3;
        let mut table = vec![1.0f32; 4 * width];
        let tokens = [2i64, 0, 2, 2];
        let values: Vec<f32> = (0..tokens.len() * width).map(|i| i as f32).collect();
        scatter_add_rows(&mut table, width, &tokens, &values).unwrap();
        let mut want = vec![1.0f32; 4 * width];
        for (p, &t) in tokens.iter().enumerate() {
            for c in 0..width {
                want[t as usize * width + c] += values[p * width + c];
            }
        }
        assert_eq!(table, want);
        // Rows 1 and 3 saw no token and keep what they held.
        assert_eq!(&table[width..2 * width], &[1.0; 3]);
    }

    #[test]
    fn scatter_add_rows_rejects_a_token_outside_the_table_and_writes_nothing() {
        let mut table = vec![0.0f32; 2 * 2];
        for bad in [2i64, -1] {
            let err = scatter_add_rows(&mut table, 2, &[0, bad], &[1.0; 4]);
            assert_eq!(err, Err(bad));
            assert_eq!(table, vec![0.0; 4]);
        }
    }
}
