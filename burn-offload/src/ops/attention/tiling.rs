//! How attention's passes cut a batch: [`Tiling`] (chunks of sequences,
//! query blocks, key tiles) and the blocks and tiles one pass walks.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

/// Most elements of one chunk's scores for one pair of a query block and a
/// key tile, `[chunk, heads, block, keys]`; a chunk has at least one
/// sequence. 2^27 is 512 MiB in f32: at 16k tokens of the 0.85B Llama (16 ×
/// 1024, blocks of 256) a chunk is the whole batch.
pub const SCORE_CHUNK_ELEMENTS: usize = 1 << 27;

/// How many blocks of consecutive query positions each sequence's causal
/// square is cut into, where the blocks' scores fit [`SCORE_CHUNK_ELEMENTS`].
/// More blocks skip more of the masked half (`(n+1)/2n` of the square is
/// computed) but launch more, smaller kernels: at 4 the 0.85B Llama's blocks
/// are 256 queries, whose matmuls still fill the GPU.
pub const QUERY_BLOCKS: usize = 4;

/// How attention's passes cut one batch: chunks of sequences, blocks of
/// consecutive query positions, and tiles of keys.
///
/// A query block sees the keys up to its last position; they are cut into
/// tiles of `key_tile` positions from the first (a multiple of `block`, so
/// that only a block's last tile reaches past its first query and needs the
/// causal mask, and every query sees at least one key of every tile). A
/// block's output is the tiles' outputs combined by their log-sum-exp, as
/// FlashAttention does within a kernel, and the backward sums each tile's
/// key and value gradients over the blocks that see it. Scores of one block
/// and tile, `[chunk, heads, block, key_tile]`, are all a pass keeps of the
/// square, so memory grows with the sequence, not its square.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiling {
    /// Sequences per chunk.
    pub chunk: usize,
    /// Query positions per block.
    pub block: usize,
    /// Key positions per tile: a multiple of `block`.
    pub key_tile: usize,
}

impl Tiling {
    /// The tiling of `heads` query heads over sequences of `seq` positions:
    /// four query blocks a sequence while one block and all its keys fit
    /// [`SCORE_CHUNK_ELEMENTS`]; past that, square tiles as large as fit it
    /// (2048 positions for 32 heads).
    pub fn new(heads: usize, seq: usize) -> Self {
        let heads = heads.max(1);
        let seq = seq.max(1);
        let side = ((SCORE_CHUNK_ELEMENTS / heads) as f64).sqrt() as usize;
        // Whole tiles of 64 where there is room, for the matmuls' sake.
        let side = if side >= 64 {
            side / 64 * 64
        } else {
            side.max(1)
        };
        let block = seq.div_ceil(QUERY_BLOCKS).min(side).max(1);
        let keys = (SCORE_CHUNK_ELEMENTS / (heads * block)).max(block);
        let key_tile = (keys / block * block).min(seq.next_multiple_of(block));
        let chunk = (SCORE_CHUNK_ELEMENTS / (heads * block * key_tile.min(seq))).max(1);
        Self {
            chunk,
            block,
            key_tile,
        }
    }

    /// Elements of the largest scores a pass holds at once over a batch of
    /// `batch` sequences.
    pub fn score_elements(&self, batch: usize, heads: usize, seq: usize) -> usize {
        self.chunk.min(batch) * heads * self.block.min(seq) * self.key_tile.min(seq)
    }

    /// Whether a sequence's keys are cut into more than one tile (a block's
    /// output is then combined from several).
    pub fn tiles_keys(&self, seq: usize) -> bool {
        self.key_tile < seq
    }
}

/// One block of queries, positions `start..start + len`, and the tiles of the
/// keys it sees (`0..start + len`); `future`, for its last tile, is `true`
/// where a query must not see a key.
pub(super) struct QueryBlock<B: Backend> {
    pub(super) start: usize,
    pub(super) len: usize,
    key_tile: usize,
    pub(super) future: Tensor<B, 2, Bool>,
}

/// Keys `start..start + len`, one tile of a query block's.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyTile {
    pub(super) start: usize,
    pub(super) len: usize,
}

impl<B: Backend> QueryBlock<B> {
    /// The blocks of `tiling.block` positions that cover `seq` (the last may
    /// be shorter), each with its last tile's mask, built once per pass and
    /// shared by the chunks.
    pub(super) fn cover(seq: usize, tiling: &Tiling, device: &B::Device) -> Vec<Self> {
        let (block, key_tile) = (tiling.block.max(1), tiling.key_tile);
        assert!(
            key_tile >= block && key_tile.is_multiple_of(block),
            "attention: key tiles of {key_tile} are not whole blocks of {block}"
        );
        (0..seq)
            .step_by(block)
            .map(|start| {
                let len = block.min(seq - start);
                // The last tile holds every query of the block (tiles are
                // whole blocks): query i (at start + i) sees its keys up to
                // start + i, so the diagonal is never masked and every row
                // has a finite maximum.
                let last = start / key_tile * key_tile;
                let future =
                    Tensor::tril_mask([len, start + len - last], (start - last) as i64, device);
                QueryBlock {
                    start,
                    len,
                    key_tile,
                    future,
                }
            })
            .collect()
    }

    pub(super) fn keys(&self) -> usize {
        self.start + self.len
    }

    /// The tiles of the keys the block sees, from the first.
    pub(super) fn tiles(&self) -> impl Iterator<Item = KeyTile> {
        let (end, size) = (self.keys(), self.key_tile);
        (0..end).step_by(size).map(move |start| KeyTile {
            start,
            len: size.min(end - start),
        })
    }

    /// The block's tile starting at key `start`, if it sees one.
    pub(super) fn tile_at(&self, start: usize) -> Option<KeyTile> {
        (start < self.keys()).then(|| KeyTile {
            start,
            len: self.key_tile.min(self.keys() - start),
        })
    }

    /// The block's first query position, counted from `tile`'s first key:
    /// query `i` of the block sees the tile's keys `0..=offset + i`.
    pub(super) fn offset(&self, tile: KeyTile) -> usize {
        self.start - tile.start
    }

    /// Whether some query of the block must not see some key of `tile` (only
    /// its last tile reaches past the first query).
    pub(super) fn masks(&self, tile: KeyTile) -> bool {
        tile.len > self.offset(tile) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequences of 1024 are cut into four blocks of 256 whose keys are one
    /// tile, and a chunk holds 32 sequences of 16 heads; long sequences into
    /// square tiles as large as fit the score budget.
    #[test]
    fn tilings_fit_the_score_budget() {
        let t = Tiling::new(16, 1024);
        assert_eq!((t.chunk, t.block, t.key_tile), (32, 256, 1024));
        assert!(!t.tiles_keys(1024));
        let t = Tiling::new(4, 7);
        assert_eq!((t.block, t.key_tile), (2, 8));
        assert_eq!(Tiling::new(1, 1).block, 1);
        let t = Tiling::new(32, 16 << 10);
        assert_eq!((t.chunk, t.block, t.key_tile), (1, 2048, 2048));
        assert!(t.tiles_keys(16 << 10));
        let t = Tiling::new(32, 256 << 10);
        assert_eq!((t.chunk, t.block, t.key_tile), (1, 2048, 2048));
        assert_eq!(t.score_elements(1, 32, 256 << 10), SCORE_CHUNK_ELEMENTS);
        for (heads, seq) in [(1, 1 << 20), (24, 131072), (8, 3000), (32, 5000)] {
            let t = Tiling::new(heads, seq);
            assert!(
                t.key_tile.is_multiple_of(t.block),
                "{heads} heads, {seq}: {t:?}"
            );
            assert!(
                t.score_elements(64, heads, seq) <= SCORE_CHUNK_ELEMENTS,
                "{t:?}"
            );
        }
    }
}
