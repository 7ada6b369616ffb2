//! Causal attention's two passes as cuDNN operation graphs, in the form
//! cuDNN's fused flash-attention engines recognise: the ops
//! cudnn-frontend's SDPA nodes lower to for cuDNN 9 before 9.21 (its
//! `CompositeSDPANode` and `CompositeSDPABackwardNode`, causal, no dropout,
//! no bias). cuDNN matches the pattern and runs each graph as one kernel
//! (forward) or a few (backward), the scores never leaving the chip.
//!
//! Layouts: `q, o, do, dq: [b, h, s, d]`, `k, v, dk, dv: [b, kv, s, d]` with
//! `h` a multiple of `kv` (grouped-query heads read their key/value head in
//! place; their key and value gradients are summed over the group inside
//! the graph), the log-sum-exp statistics f32 `[b, h, s, 1]`.

use cudarc::cudnn::sys::{
    cudnnDataType_t as DataType, cudnnPointwiseMode_t as Mode, cudnnReduceTensorOp_t as Reduce,
};

use super::backend::Result;
use super::graph::{packed, Graph, Node};

/// The tensors and scalars a launch binds, by unique id.
pub(super) mod uid {
    pub const Q: i64 = 1;
    pub const K: i64 = 2;
    pub const V: i64 = 3;
    pub const O: i64 = 4;
    pub const STATS: i64 = 5;
    pub const DO: i64 = 6;
    pub const DQ: i64 = 7;
    pub const DK: i64 = 8;
    pub const DV: i64 = 9;
    pub const SCALE: i64 = 10;
    pub const NEG_INF: i64 = 11;
    pub const ONE: i64 = 12;
    pub const WINDOW: i64 = 13;
    pub const WINDOW_NEG_INF: i64 = 14;
    /// `rowsum(do ⊙ o)`, f32 `[b, h, s, 1]`.
    pub const ROW_DOT: i64 = 15;
    /// The query gradient's f32 sums, `[b, h, s, d]`.
    pub const DQ_SUM: i64 = 16;
    /// The graphs' own tensors take ids from here.
    pub const FIRST_INNER: i64 = 100;
}

/// One call's shapes, layouts and options: what a plan is built for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Shape {
    pub batch: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub seq: i64,
    pub dim: i64,
    /// bf16 or f16: the inputs', outputs' and gradients' type.
    pub io: DataType,
    /// Positions a query sees, itself included; `None`: every earlier one.
    pub window: Option<i64>,
    /// Strides in elements of the bound inputs, in the order the pass binds
    /// them (`q, k, v` forward; `q, k, v, o, do, stats` backward).
    pub strides: Vec<[i64; 4]>,
}

const F32: DataType = DataType::CUDNN_DATA_FLOAT;

/// `dims` and `strides` with the last two dimensions swapped: a `[.., s, d]`
/// tensor read as its transpose.
fn transposed([a, b, c, d]: [i64; 4]) -> [i64; 4] {
    [a, b, d, c]
}

/// The forward: `o = softmax(scale · q·kᵀ + mask) · v` and each row's
/// log-sum-exp `stats` (f32), for the backward.
pub(super) fn forward(g: &mut Graph, s: &Shape) -> Result<()> {
    let (b, h, kv, n, d) = (s.batch, s.heads, s.kv_heads, s.seq, s.dim);
    let q = g.bound(uid::Q, [b, h, n, d], s.strides[0], s.io)?;
    let kt = g.bound(uid::K, [b, kv, d, n], transposed(s.strides[1]), s.io)?;
    let v = g.bound(uid::V, [b, kv, n, d], s.strides[2], s.io)?;
    let o = g.bound(uid::O, [b, h, n, d], packed([b, h, n, d]), s.io)?;
    let stats = g.bound(uid::STATS, [b, h, n, 1], packed([b, h, n, 1]), F32)?;
    let scale = g.scalar(uid::SCALE, F32)?;

    let scores = g.inner([b, h, n, n], packed([b, h, n, n]), F32)?;
    g.matmul(q, kt, scores)?;
    let scaled = g.map(Mode::CUDNN_POINTWISE_MUL, &[scores, scale], scores, F32)?;
    let masked = mask(g, scaled, s.window)?;

    // The softmax, as the frontend writes it: max, shift, exp, sum; the
    // statistics are max + log(sum).
    let row = [b, h, n, 1];
    let max = g.inner(row, packed(row), F32)?;
    g.reduce(Reduce::CUDNN_REDUCE_TENSOR_MAX, masked, max)?;
    let shifted = g.map(Mode::CUDNN_POINTWISE_SUB, &[masked, max], masked, F32)?;
    let exp = g.map(Mode::CUDNN_POINTWISE_EXP, &[shifted], masked, F32)?;
    let sum = g.inner(row, packed(row), F32)?;
    g.reduce(Reduce::CUDNN_REDUCE_TENSOR_ADD, exp, sum)?;
    let log = g.map(Mode::CUDNN_POINTWISE_LOG, &[sum], sum, F32)?;
    g.pointwise(Mode::CUDNN_POINTWISE_ADD, &[max, log], stats, F32, None)?;
    // The probabilities enter the second product in the inputs' type.
    let probs = g.map(Mode::CUDNN_POINTWISE_DIV, &[exp, sum], exp, s.io)?;
    g.matmul(probs, v, o)
}

/// The backward: `dq, dk, dv` from `q, k, v`, the output `o`, its gradient
/// `do` and the forward's statistics, recomputing the probabilities.
pub(super) fn backward(g: &mut Graph, s: &Shape) -> Result<()> {
    let (b, h, kv, n, d) = (s.batch, s.heads, s.kv_heads, s.seq, s.dim);
    let q = g.bound(uid::Q, [b, h, n, d], s.strides[0], s.io)?;
    let kt = g.bound(uid::K, [b, kv, d, n], transposed(s.strides[1]), s.io)?;
    let vt = g.bound(uid::V, [b, kv, d, n], transposed(s.strides[2]), s.io)?;
    let o = g.bound(uid::O, [b, h, n, d], s.strides[3], s.io)?;
    let d_o = g.bound(uid::DO, [b, h, n, d], s.strides[4], s.io)?;
    let stats = g.bound(uid::STATS, [b, h, n, 1], s.strides[5], F32)?;
    let dq = g.bound(uid::DQ, [b, h, n, d], packed([b, h, n, d]), s.io)?;
    let dk = g.bound(uid::DK, [b, kv, n, d], packed([b, kv, n, d]), s.io)?;
    let dv = g.bound(uid::DV, [b, kv, n, d], packed([b, kv, n, d]), s.io)?;
    let scale = g.scalar(uid::SCALE, F32)?;
    let one = g.scalar(uid::ONE, F32)?;

    // rowsum(do ⊙ o): the softmax gradient's per-row term.
    let row = [b, h, n, 1];
    let prod = g.inner([b, h, n, d], packed([b, h, n, d]), F32)?;
    g.pointwise(Mode::CUDNN_POINTWISE_MUL, &[d_o, o], prod, F32, None)?;
    let dot = g.inner(row, packed(row), F32)?;
    g.reduce(Reduce::CUDNN_REDUCE_TENSOR_ADD, prod, dot)?;
    let row_dot = g.bound(uid::ROW_DOT, row, packed(row), F32)?;
    g.pointwise(Mode::CUDNN_POINTWISE_MUL, &[dot, one], row_dot, F32, None)?;

    // The probabilities, recomputed from the statistics.
    let score_dims = [b, h, n, n];
    let scores = g.inner(score_dims, packed(score_dims), F32)?;
    g.matmul(q, kt, scores)?;
    let scaled = g.map(Mode::CUDNN_POINTWISE_MUL, &[scores, scale], scores, F32)?;
    let shifted = g.map(Mode::CUDNN_POINTWISE_SUB, &[scaled, stats], scores, F32)?;
    let masked = mask(g, shifted, s.window)?;
    let probs = g.map(Mode::CUDNN_POINTWISE_EXP, &[masked], scores, F32)?;

    // dv = pᵀ · do (summed over each key/value head's group).
    let probs_t = g.inner(score_dims, transposed(packed(score_dims)), s.io)?;
    g.reshape(probs, probs_t)?;
    grouped_product(g, probs_t, d_o, dv, s)?;

    // ds = scale · p ⊙ (do · vᵀ − rowsum(do ⊙ o)).
    let dp = g.inner(score_dims, packed(score_dims), F32)?;
    g.matmul(d_o, vt, dp)?;
    let centred = g.map(Mode::CUDNN_POINTWISE_SUB, &[dp, row_dot], dp, F32)?;
    let weighted = g.map(Mode::CUDNN_POINTWISE_MUL, &[centred, probs], dp, F32)?;
    let ds = g.map(Mode::CUDNN_POINTWISE_MUL, &[weighted, scale], dp, F32)?;

    // dk = dsᵀ · q (summed over the group).
    let ds_t = g.inner(score_dims, transposed(packed(score_dims)), s.io)?;
    g.reshape(ds, ds_t)?;
    grouped_product(g, ds_t, q, dk, s)?;

    // dq = ds · k, summed in f32 and written in the inputs' type.
    let k = g.inner([b, kv, n, d], s.strides[1], s.io)?;
    g.reshape(kt, k)?;
    let dq_sum = g.bound(uid::DQ_SUM, [b, h, n, d], packed([b, h, n, d]), F32)?;
    g.matmul(ds, k, dq_sum)?;
    g.pointwise(Mode::CUDNN_POINTWISE_IDENTITY, &[dq_sum], dq, F32, None)
}

/// `out = a · x` where `a` has a row block per query head and `out` one per
/// key/value head: the product per query head, then summed over each group.
fn grouped_product(g: &mut Graph, a: Node, x: Node, out: Node, s: &Shape) -> Result<()> {
    if s.heads == s.kv_heads {
        return g.matmul(a, x, out);
    }
    let dims = [s.batch, s.heads, s.seq, s.dim];
    let full = g.inner(dims, packed(dims), s.io)?;
    g.matmul(a, x, full)?;
    g.reduce(Reduce::CUDNN_REDUCE_TENSOR_ADD, full, out)
}

/// `scores` with the keys a query must not see at −∞: those after it, and
/// with a `window`, those `window` or more positions before it (the
/// frontend's top-left diagonal band: keep `row ≥ col`, then `col + window
/// > row`).
fn mask(g: &mut Graph, scores: Node, window: Option<i64>) -> Result<Node> {
    let causal = band(g, scores, uid::NEG_INF, None)?;
    match window {
        None => Ok(causal),
        Some(_) => band(g, causal, uid::WINDOW_NEG_INF, Some(uid::WINDOW)),
    }
}

/// One side of the band: without `window_uid`, `row ≥ col`; with it,
/// `col + window > row` (the window an f32 scalar bound to that id).
fn band(g: &mut Graph, scores: Node, neg_inf_uid: i64, window_uid: Option<i64>) -> Result<Node> {
    let int32 = DataType::CUDNN_DATA_INT32;
    let boolean = DataType::CUDNN_DATA_BOOLEAN;
    let index = |g: &mut Graph, axis| -> Result<Node> {
        let i = g.inner_like(scores, int32)?;
        g.pointwise(
            Mode::CUDNN_POINTWISE_GEN_INDEX,
            &[scores],
            i,
            F32,
            Some(axis),
        )?;
        Ok(i)
    };
    let (row, col) = (index(g, 2)?, index(g, 3)?);
    let keep = g.inner_like(scores, boolean)?;
    match window_uid {
        None => g.pointwise(
            Mode::CUDNN_POINTWISE_CMP_GE,
            &[row, col],
            keep,
            boolean,
            None,
        )?,
        Some(uid) => {
            let window = g.scalar(uid, F32)?;
            let reach = g.map(Mode::CUDNN_POINTWISE_ADD, &[col, window], scores, F32)?;
            g.pointwise(
                Mode::CUDNN_POINTWISE_CMP_GT,
                &[reach, row],
                keep,
                boolean,
                None,
            )?;
        }
    }
    let neg_inf = g.scalar(neg_inf_uid, F32)?;
    g.map(
        Mode::CUDNN_POINTWISE_BINARY_SELECT,
        &[scores, neg_inf, keep],
        scores,
        F32,
    )
}
