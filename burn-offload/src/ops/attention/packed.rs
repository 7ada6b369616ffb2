//! Attention over packed windows: each position sees only the earlier
//! positions of its own document ([`Documents`]).
//!
//! Where every row is one document, the calls here are the plain ones
//! (fused kernels included). Otherwise:
//! - on the autodiff backends with a backward of their own, and without a
//!   graph, the query blocks and key tiles of [`Tiling`] run with each
//!   tile's scores masked where query and key lie in different documents
//!   (besides the causal mask), and the tiles that lie wholly before the
//!   documents of a block's first query, in every row, are skipped: with
//!   short documents most of the square is never computed;
//! - a sliding window as well, or an autodiff backend that differentiates
//!   op by op, runs the reference formulation with both masks.
//!
//! The fused CUDA kernels (`flash`) know only the causal mask and a window:
//! a document-masked call never reaches them, on CUDA it takes the tiles in
//! tensor ops (not the fused per-tile softmax, which knows only the causal
//! offset). cuDNN's ragged sequences take [`Documents::cu_seqlens`], for the
//! CUDA dispatch to take these calls over.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Bool, DType, Tensor, TensorData};

use crate::documents::Documents;
use crate::ops::record::{backward_each, cast, float, record, same, tensor, with_custom_backward};
use crate::precision::cast_to;

use super::base::{
    accumulate, add_leading, attention_by, by_chunks, check_shapes, dense, grouped, join_rows,
    query_rows, reference_masked, scaled_scores,
};
use super::route::Passes;
use super::tiling::{KeyTile, QueryBlock, Tiling, QUERY_BLOCKS};

/// [`causal_attention`](super::causal_attention) within each document of
/// `documents` (`[batch, seq]`, as `q`'s): a position sees itself and the
/// earlier positions of its own document only.
///
/// # Panics
/// As [`causal_attention`](super::causal_attention), and if `documents` is
/// not for `[batch, seq]`.
pub fn causal_attention_in<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    documents: &Documents,
) -> Tensor<B, 4> {
    packed_by(q, k, v, None, None, documents)
}

/// [`windowed_attention`](super::windowed_attention) within each document:
/// a position sees at most `window` positions, all of its own document.
///
/// # Panics
/// As [`causal_attention_in`], and if `window` is 0.
pub fn windowed_attention_in<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    window: usize,
    documents: &Documents,
) -> Tensor<B, 4> {
    assert!(window > 0, "attention: a window of 0 positions");
    packed_by(q, k, v, None, Some(window), documents)
}

/// [`causal_attention_in`] through query blocks and key tiles cut by
/// `tiling` (the tests' handle on the tiles): never the fused kernels.
///
/// # Panics
/// As [`causal_attention_in`], and if the key tile is not a multiple of the
/// query block.
pub fn causal_attention_tiled_in<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    tiling: Tiling,
    documents: &Documents,
) -> Tensor<B, 4> {
    packed_by(q, k, v, Some(tiling), None, documents)
}

/// The reference formulation in tensor ops (burn differentiates it op by
/// op) with the documents' mask and, where given, a sliding `window`.
///
/// # Panics
/// As [`causal_attention_in`], and if `window` is 0.
pub fn reference_attention_in<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    window: Option<usize>,
    documents: &Documents,
) -> Tensor<B, 4> {
    assert!(window != Some(0), "attention: a window of 0 positions");
    check_documents(&q, documents);
    let hidden = other_documents(documents, &q.device());
    reference_masked(q, k, v, window, Some(hidden))
}

fn check_documents<B: Backend>(q: &Tensor<B, 4>, documents: &Documents) {
    let [batch, _, seq, _] = q.dims();
    assert_eq!(
        documents.dims(),
        [batch, seq],
        "attention: documents for {:?} [batch, seq], queries {:?}",
        documents.dims(),
        q.dims()
    );
}

fn packed_by<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    tiling: Option<Tiling>,
    window: Option<usize>,
    documents: &Documents,
) -> Tensor<B, 4> {
    check_shapes(&q, &k, &v);
    check_documents(&q, documents);
    let [batch, heads, seq, head_dim] = q.dims();
    let window = window.filter(|&w| w < seq);
    if documents.is_whole() {
        let passes = tiling.map_or(Passes::Auto, Passes::Tiled);
        return attention_by(q, k, v, passes, window);
    }
    if window.is_some() {
        // The tiles have no window mask (nor do they with documents).
        return reference_attention_in(q, k, v, window, documents);
    }
    // Not the fused kernels: they know no documents (see the module's note).
    let tiling = tiling.unwrap_or_else(|| Tiling::new(heads, seq));
    macro_rules! tracked_on {
        ($inner:ty) => {
            if same::<B, Autodiff<$inner>>() {
                return cast(tracked::<$inner>(
                    cast(q),
                    cast(k),
                    cast(v),
                    tiling,
                    documents,
                ));
            }
        };
    }
    with_custom_backward!(tracked_on);
    if B::ad_enabled(&q.device()) {
        return reference_attention_in(q, k, v, None, documents);
    }
    let ids = segment_ids(documents, &q.device());
    packed_forward(q, k, v, ids, tiling, documents)
        .0
        .reshape([batch, heads, seq, head_dim])
}

/// `true` where query and key lie in different documents, `[batch, 1, seq,
/// seq]`: the reference's mask beside the causal one.
fn other_documents<B: Backend>(documents: &Documents, device: &B::Device) -> Tensor<B, 4, Bool> {
    let ids = segment_ids::<B>(documents, device);
    let [batch, _, seq, _] = ids.dims();
    let keys = ids.clone().swap_dims(2, 3).expand([batch, 1, seq, seq]);
    ids.expand([batch, 1, seq, seq]).not_equal(keys)
}

/// Each position's document in its row, `[batch, 1, seq, 1]` in f32 (exact
/// for the fewer than 2^24 documents a row holds), so it is cut into chunks
/// and rows with the queries.
fn segment_ids<B: Backend>(documents: &Documents, device: &B::Device) -> Tensor<B, 4> {
    let [batch, seq] = documents.dims();
    let ids: Vec<f32> = documents
        .segment_ids()
        .into_iter()
        .map(|id| id as f32)
        .collect();
    cast_to(
        Tensor::from_data(TensorData::new(ids, [batch, 1, seq, 1]), device),
        DType::F32,
    )
}

/// `true` where a query of `block` must not see a key of `tile`, `[c, 1,
/// len, keys]` for the chunk's segment ids `ids` (`[c, 1, seq, 1]`): another
/// document, or (in the block's last tile) a later position.
fn hidden<B: Backend>(
    ids: &Tensor<B, 4>,
    block: &QueryBlock<B>,
    tile: KeyTile,
) -> Tensor<B, 4, Bool> {
    let c = ids.dims()[0];
    let shape = [c, 1, block.len, tile.len];
    let queries = ids.clone().narrow(2, block.start, block.len).expand(shape);
    let keys = ids
        .clone()
        .narrow(2, tile.start, tile.len)
        .swap_dims(2, 3)
        .expand(shape);
    let other = queries.not_equal(keys);
    if !block.masks(tile) {
        return other;
    }
    let future = block.future.clone().unsqueeze::<4>().expand(shape);
    other.bool_or(future)
}

/// `scores` (`[c, kv, g·len, keys]`) at −∞ where `hidden` (`[c, 1, len, keys]`).
fn masked<B: Backend>(scores: Tensor<B, 4>, hidden: Tensor<B, 4, Bool>) -> Tensor<B, 4> {
    let [c, kv, rows, keys] = scores.dims();
    let len = hidden.dims()[2];
    let groups = rows / len;
    let hidden = hidden
        .unsqueeze_dim::<5>(2)
        .expand([c, kv, groups, len, keys]);
    scores
        .reshape([c, kv, groups, len, keys])
        .mask_fill(hidden, f32::NEG_INFINITY)
        .reshape([c, kv, rows, keys])
}

/// For each block, the first key any of its queries sees, over every row:
/// the earliest start of the documents holding its first position (a later
/// query's document starts no earlier). Tiles ending at or before it are
/// skipped in both passes.
fn first_seen<B: Backend>(blocks: &[QueryBlock<B>], documents: &Documents) -> Vec<usize> {
    blocks
        .iter()
        .map(|b| documents.earliest_start_at(b.start))
        .collect()
}

/// `t` with −∞ replaced by 0: the shift of a row that sees no key of a
/// tile, so its weights are `exp(−∞) = 0` rather than NaN.
fn finite_shift<B: Backend>(t: Tensor<B, 4>) -> Tensor<B, 4> {
    let empty = t.clone().equal_elem(f32::NEG_INFINITY);
    t.mask_fill(empty, 0.0)
}

/// One key tile's share of a query block's output and its rows'
/// log-sum-exp, with `hidden` masked. A row that sees none of the tile's
/// keys (a document that starts later) gets an output of 0 and a
/// log-sum-exp of −∞, which [`combine`] weighs at 0.
fn tile_forward<B: Backend>(
    [q, k, v]: [Tensor<B, 4>; 3],
    scale: f64,
    hidden: Tensor<B, 4, Bool>,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let scores = masked(scaled_scores(q, k, scale), hidden);
    let max = finite_shift(scores.clone().max_dim(3));
    let weights = (scores - max.clone()).exp();
    let sums = weights.clone().sum_dim(3);
    // A row that sees a key sums to at least 1 (its maximum's weight).
    let output = weights.matmul(v) / sums.clone().clamp_min(1.0);
    (output, max + sums.log())
}

/// Two tiles' outputs of the same queries as one, in f32, each weighted by
/// its share of the joint softmax's denominator; rows that see no key of
/// either stay at 0 and −∞.
fn combine<B: Backend>(
    (sum, sum_lse): (Tensor<B, 4>, Tensor<B, 4>),
    (part, part_lse): (Tensor<B, 4>, Tensor<B, 4>),
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let (sum, sum_lse) = (cast_to(sum, DType::F32), cast_to(sum_lse, DType::F32));
    let part_lse = cast_to(part_lse, DType::F32);
    let max = finite_shift(sum_lse.clone().max_pair(part_lse.clone()));
    let (a, b) = (
        (sum_lse - max.clone()).exp(),
        (part_lse - max.clone()).exp(),
    );
    let total = a.clone() + b.clone();
    // At least 1 where either side sees a key (the larger side's weight).
    let output = (sum * a + cast_to(part, DType::F32) * b) / total.clone().clamp_min(1.0);
    (output, max + total.log())
}

/// The forward: the output in the grouped layout `[b, kv, g·s, d]` and each
/// row's log-sum-exp `[b, kv, g·s, 1]` in f32, for segment ids `ids`.
fn packed_forward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    ids: Tensor<B, 4>,
    tiling: Tiling,
    documents: &Documents,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let [_, heads, seq, head_dim] = q.dims();
    let groups = heads / k.dims()[1];
    let scale = 1.0 / (head_dim as f64).sqrt();
    let dtype = q.dtype();
    let q = grouped(q, k.dims()[1]);
    let (k, v) = (dense(k), dense(v));
    let blocks = QueryBlock::cover(seq, &tiling, &k.device());
    let seen = first_seen(&blocks, documents);
    let [output, lse] = by_chunks([q, k, v, ids], tiling.chunk, |[q, k, v, ids]| {
        let (mut outputs, mut lses) = (Vec::new(), Vec::new());
        for (block, &seen) in blocks.iter().zip(&seen) {
            let q = query_rows(&q, seq, block.start, block.len);
            let mut sum: Option<(Tensor<B, 4>, Tensor<B, 4>)> = None;
            for tile in block.tiles().filter(|t| t.start + t.len > seen) {
                let keys = |x: &Tensor<B, 4>| x.clone().narrow(2, tile.start, tile.len);
                let hidden = hidden(&ids, block, tile);
                let part = tile_forward([q.clone(), keys(&k), keys(&v)], scale, hidden);
                sum = Some(match sum {
                    None => part,
                    Some(first) => combine(first, part),
                });
            }
            // The last tile holds the diagonal, which no mask hides.
            let (output, lse) = sum.expect("a query block sees its last tile");
            outputs.push(cast_to(output, dtype));
            lses.push(cast_to(lse, DType::F32));
        }
        [join_rows(outputs, groups), join_rows(lses, groups)]
    });
    (output, lse)
}

/// The backward: `(dq, dk, dv)` for the output gradient `grad` in the
/// grouped layout, as `attention_backward` in `base.rs` with the documents'
/// masks and skipped tiles: a key tile no block sees gets zero gradients.
fn packed_backward<B: Backend>(
    [q, k, v, output, lse, ids]: [Tensor<B, 4>; 6],
    grad: Tensor<B, 4>,
    tiling: Tiling,
    documents: &Documents,
) -> [Tensor<B, 4>; 3] {
    let [batch, heads, seq, head_dim] = q.dims();
    let groups = heads / k.dims()[1];
    let scale = 1.0 / (head_dim as f64).sqrt();
    let dtype = q.dtype();
    // As in `attention_backward`: long sums in f32.
    let sum_dtype = if tiling.tiles_keys(seq) || seq.div_ceil(tiling.block) > QUERY_BLOCKS {
        DType::F32
    } else {
        dtype
    };
    let q = grouped(q, k.dims()[1]);
    let (k, v) = (dense(k), dense(v));
    let blocks = QueryBlock::cover(seq, &tiling, &k.device());
    let seen = first_seen(&blocks, documents);
    let [dq, dk, dv] = by_chunks(
        [q, k, v, output, lse, grad, ids],
        tiling.chunk,
        |[q, k, v, output, lse, grad, ids]| {
            let row_dot = (grad.clone() * output).sum_dim(3);
            let mut dqs: Vec<Option<Tensor<B, 4>>> = vec![None; blocks.len()];
            let (mut dks, mut dvs) = (Vec::new(), Vec::new());
            for first_key in (0..seq).step_by(tiling.key_tile) {
                let (mut dk, mut dv): (Option<Tensor<B, 4>>, Option<Tensor<B, 4>>) = (None, None);
                // From the last block: a block that skips the tile is
                // followed only by blocks that skip it too, so the first to
                // add holds the longest share and the others add to its
                // leading rows.
                for (i, block) in blocks.iter().enumerate().rev() {
                    let Some(tile) = block.tile_at(first_key) else {
                        break;
                    };
                    if tile.start + tile.len <= seen[i] {
                        continue;
                    }
                    let rows = |x: &Tensor<B, 4>| query_rows(x, seq, block.start, block.len);
                    let keys = |x: &Tensor<B, 4>| x.clone().narrow(2, tile.start, tile.len);
                    let (q, grad, k, v) = (rows(&q), rows(&grad), keys(&k), keys(&v));
                    let scores = scaled_scores(q.clone(), k.clone(), scale);
                    let scores = masked(scores, hidden(&ids, block, tile));
                    let dprobs = grad.clone().matmul(v.swap_dims(2, 3));
                    // Every row's log-sum-exp is finite (it sees its own
                    // position), so hidden entries give exp(−∞) = 0.
                    let lse = cast_to(rows(&lse), scores.dtype());
                    let probs = (scores - lse).exp();
                    let dscores = probs.clone() * (dprobs - rows(&row_dot));
                    let dv_part = probs.swap_dims(2, 3).matmul(grad);
                    dqs[i] = Some(accumulate(
                        dqs[i].take(),
                        dscores.clone().matmul(k),
                        sum_dtype,
                    ));
                    let dk_part = dscores.swap_dims(2, 3).matmul(q);
                    dk = Some(add_leading(dk, dk_part, sum_dtype));
                    dv = Some(add_leading(dv, dv_part, sum_dtype));
                }
                // Zeros past the share of the last block that sees the
                // tile (or in place of it, where every block skips it).
                let tile_len = tiling.key_tile.min(seq - first_key);
                let [c, kv, _, _] = k.dims();
                let whole = |part: Option<Tensor<B, 4>>| {
                    let zeros =
                        || Tensor::zeros([c, kv, tile_len, head_dim], (&k.device(), sum_dtype));
                    match part {
                        None => zeros(),
                        Some(part) if part.dims()[2] == tile_len => part,
                        Some(part) => add_leading(Some(zeros()), part, sum_dtype),
                    }
                };
                dks.push(whole(dk));
                dvs.push(whole(dv));
            }
            let dqs = dqs
                .into_iter()
                .map(|dq| dq.expect("every block sees its last tile"))
                .collect();
            let join = |parts: Vec<Tensor<B, 4>>| match parts.len() {
                1 => parts.into_iter().next().expect("one tile"),
                _ => Tensor::cat(parts, 2),
            };
            [
                cast_to(join_rows(dqs, groups) * scale, dtype),
                cast_to(join(dks) * scale, dtype),
                cast_to(join(dvs), dtype),
            ]
        },
    );
    [dq.reshape([batch, heads, seq, head_dim]), dk, dv]
}

#[derive(Debug)]
struct PackedAttention {
    tiling: Tiling,
    documents: Documents,
}

impl<B: Backend> Backward<B, 3> for PackedAttention {
    /// `q`, `k`, `v`, the grouped output, its log-sum-exp and the segment ids.
    type State = [FloatTensor<B>; 6];

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_each::<B, _, 3>(ops, grads, |state, grad| {
            let saved = state.map(tensor::<B, 4>);
            let grad = grouped(tensor::<B, 4>(grad), saved[1].dims()[1]);
            packed_backward(saved, grad, self.tiling, &self.documents).map(float)
        });
    }
}

/// [`causal_attention_in`] on `Autodiff<B>` as one operation.
fn tracked<B: Backend>(
    q: Tensor<Autodiff<B>, 4>,
    k: Tensor<Autodiff<B>, 4>,
    v: Tensor<Autodiff<B>, 4>,
    tiling: Tiling,
    documents: &Documents,
) -> Tensor<Autodiff<B>, 4> {
    let [batch, heads, seq, head_dim] = q.dims();
    let (q, k, v) = (float(q), float(k), float(v));
    let ids = segment_ids::<B>(documents, &tensor::<B, 4>(q.primitive.clone()).device());
    let (output, lse) = packed_forward::<B>(
        tensor(q.primitive.clone()),
        tensor(k.primitive.clone()),
        tensor(v.primitive.clone()),
        ids.clone(),
        tiling,
        documents,
    );
    let result = float(output.clone().reshape([batch, heads, seq, head_dim]));
    let op = PackedAttention {
        tiling,
        documents: documents.clone(),
    };
    tensor(record(op, [q, k, v], result, |[q, k, v]| {
        [q, k, v, float(output), float(lse), float(ids)]
    }))
}

#[cfg(test)]
mod tests;
