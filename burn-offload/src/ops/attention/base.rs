use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Bool, DType, Tensor};

use crate::ops::record::{backward_each, cast, float, record, same, tensor, with_custom_backward};
use crate::precision::cast_to;

use super::memo;
use super::route::{after_cudnn, routed, Passes};
use super::tiling::{KeyTile, QueryBlock, Tiling, QUERY_BLOCKS};

/// `softmax(q·kᵀ / √d + causal mask) · v` for `q: [batch, heads, seq, d]` and
/// `k, v: [batch, kv_heads, seq, d]`, each key/value head serving
/// `heads / kv_heads` consecutive query heads.
///
/// On CUDA, for head widths the fused kernels take (16, 32, 64, 128): in
/// bf16 and f16 both passes are those kernels, except the backward of heads
/// wider than [`MMA_BACKWARD_MAX_WIDTH`] past [`FUSED_BACKWARD_UP_TO`]
/// positions; in f32 both passes up to [`FUSED_BACKWARD_UP_TO`] and past it
/// the forward for heads of at most 64 values. The rest runs the query
/// blocks and key tiles of [`Tiling::new`].
///
/// [`MMA_BACKWARD_MAX_WIDTH`]: super::MMA_BACKWARD_MAX_WIDTH
/// [`FUSED_BACKWARD_UP_TO`]: super::FUSED_BACKWARD_UP_TO
///
/// # Panics
/// If the shapes disagree or `heads` is not a multiple of `kv_heads`.
pub fn causal_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    attention_by(q, k, v, Passes::Auto, None)
}

/// [`causal_attention`] where each position sees at most `window` positions:
/// itself and the `window − 1` before it (Mistral's sliding window).
///
/// Past `window` positions, on CUDA where the fused kernels take the
/// tensors, both passes are those kernels, which skip the tiles outside the
/// window (time grows with `seq · window`, memory with `seq`); elsewhere the
/// reference formulation runs, with its `[batch, heads, seq, seq]` scores.
///
/// # Panics
/// As [`causal_attention`], and if `window` is 0.
pub fn windowed_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    window: usize,
) -> Tensor<B, 4> {
    assert!(window > 0, "attention: a window of 0 positions");
    attention_by(q, k, v, Passes::Auto, Some(window))
}

/// [`causal_attention`] with both passes in the fused kernels at any length
/// (where they take the tensors; otherwise as [`causal_attention`]): the
/// kernels' tests and benchmarks.
pub fn causal_attention_fused<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    attention_by(q, k, v, Passes::Fused, None)
}

/// [`causal_attention`] through query blocks and key tiles cut by `tiling`,
/// never the fused kernels (where it runs as one operation, or without a
/// graph; otherwise the reference formulation, which does not tile).
///
/// # Panics
/// As [`causal_attention`], and if the key tile is not a multiple of the
/// query block.
pub fn causal_attention_tiled<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    tiling: Tiling,
) -> Tensor<B, 4> {
    attention_by(q, k, v, Passes::Tiled(tiling), None)
}

/// `passes` with [`causal_attention`]'s choice made for `q`, an inner
/// tensor (autodiff's are not CUDA tensors): once, for both passes. `None`
/// where only the reference formulation runs: a sliding `window` (shorter
/// than the sequence) on tensors the fused kernels do not take, as the
/// tiles have no window mask.
fn resolved<B: Backend>(passes: Passes, q: &Tensor<B, 4>, window: Option<usize>) -> Option<Passes> {
    let [_, heads, seq, head_dim] = q.dims();
    Some(match passes {
        // cuDNN with a window only where the fused kernels could take over
        // a shape it refuses (the tiles have no window mask).
        Passes::Auto if cudnn_takes(q) && (window.is_none() || fuses(q)) => Passes::Cudnn,
        _ if window.is_some() => fuses(q).then_some(Passes::Fused)?,
        Passes::Auto | Passes::Fused if !fuses(q) => Passes::Tiled(Tiling::new(heads, seq)),
        Passes::Auto => routed(heads, seq, head_dim, q.dtype()),
        passes => passes,
    })
}

/// Whether cuDNN's fused attention may run on `q`.
fn cudnn_takes<B: Backend>(q: &Tensor<B, 4>) -> bool {
    #[cfg(feature = "cuda")]
    return super::cudnn::takes(q);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = q;
        false
    }
}

/// Whether the fused kernels take `q` (and keys and values like it).
fn fuses<B: Backend>(q: &Tensor<B, 4>) -> bool {
    #[cfg(feature = "cuda")]
    return super::flash::takes(q);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = q;
        false
    }
}

pub(super) fn attention_by<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    passes: Passes,
    window: Option<usize>,
) -> Tensor<B, 4> {
    check_shapes(&q, &k, &v);
    let [batch, heads, seq, head_dim] = q.dims();
    // A window as long as the sequence hides nothing the causal mask shows.
    let window = window.filter(|&w| w < seq);
    macro_rules! tracked_on {
        ($inner:ty) => {
            if same::<B, Autodiff<$inner>>() {
                return cast(tracked::<$inner>(cast(q), cast(k), cast(v), passes, window));
            }
        };
    }
    with_custom_backward!(tracked_on);
    if B::ad_enabled(&q.device()) {
        return reference_attention(q, k, v, window);
    }
    match resolved(passes, &q, window) {
        Some(passes) => {
            let (output, lse) = attention_forward(q, k, v, passes, window);
            memo::keep(&output, &lse);
            output.reshape([batch, heads, seq, head_dim])
        }
        None => reference_attention(q, k, v, window),
    }
}

/// Whether [`causal_attention`] runs as one operation with its own backward
/// on `B` (rather than as tensor ops that autodiff records one by one).
pub fn has_custom_backward<B: Backend>() -> bool {
    macro_rules! found_on {
        ($inner:ty) => {
            if same::<B, Autodiff<$inner>>() {
                return true;
            }
        };
    }
    with_custom_backward!(found_on);
    false
}

pub(super) fn check_shapes<B: Backend>(q: &Tensor<B, 4>, k: &Tensor<B, 4>, v: &Tensor<B, 4>) {
    let ([b, h, s, d], kd) = (q.dims(), k.dims());
    assert_eq!(kd, v.dims(), "attention: keys and values differ in shape");
    assert!(
        kd[0] == b && kd[2] == s && kd[3] == d && kd[1] > 0 && h.is_multiple_of(kd[1]),
        "attention: queries {:?} and keys {kd:?} do not match",
        q.dims()
    );
}

/// The queries of each key/value group end to end: `[b, h, s, d] → [b, kv, g·s, d]`.
pub(super) fn grouped<B: Backend>(q: Tensor<B, 4>, kv_heads: usize) -> Tensor<B, 4> {
    let [b, h, s, d] = q.dims();
    q.reshape([b, kv_heads, h / kv_heads * s, d])
}

/// Rows `start..start + len` of each query head in the grouped layout
/// `[b, kv, g·seq, w]`, as `[b, kv, g·len, w]`.
pub(super) fn query_rows<B: Backend>(
    x: &Tensor<B, 4>,
    seq: usize,
    start: usize,
    len: usize,
) -> Tensor<B, 4> {
    let [b, kv, rows, w] = x.dims();
    if len == seq {
        return x.clone();
    }
    let groups = rows / seq;
    x.clone()
        .reshape([b, kv, groups, seq, w])
        .narrow(3, start, len)
        .reshape([b, kv, groups * len, w])
}

/// The query blocks' rows, `[b, kv, g·len, w]` each, joined back into the
/// grouped layout of `groups` heads (the inverse of [`query_rows`] over
/// consecutive blocks).
pub(super) fn join_rows<B: Backend>(parts: Vec<Tensor<B, 4>>, groups: usize) -> Tensor<B, 4> {
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    let [b, kv, _, w] = parts[0].dims();
    let parts: Vec<_> = parts
        .into_iter()
        .map(|p| {
            let len = p.dims()[2] / groups;
            p.reshape([b, kv, groups, len, w])
        })
        .collect();
    let joined = Tensor::cat(parts, 3);
    let seq = joined.dims()[3];
    joined.reshape([b, kv, groups * seq, w])
}

/// Scaled scores of one query block and key tile, `[b, kv, g·len, keys]`,
/// for its grouped queries `q` and the tile's keys `k` (unmasked).
pub(super) fn scaled_scores<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    scale: f64,
) -> Tensor<B, 4> {
    (q * scale).matmul(k.swap_dims(2, 3))
}

/// `scores` of a query block's last tile with the keys its queries must not
/// see at −∞.
fn masked<B: Backend>(scores: Tensor<B, 4>, block: &QueryBlock<B>) -> Tensor<B, 4> {
    let [b, kv, rows, keys] = scores.dims();
    let groups = rows / block.len;
    // Each query head of a group has the same mask.
    let future = block
        .future
        .clone()
        .unsqueeze::<5>()
        .expand([b, kv, groups, block.len, keys]);
    scores
        .reshape([b, kv, groups, block.len, keys])
        .mask_fill(future, f32::NEG_INFINITY)
        .reshape([b, kv, rows, keys])
}

/// `t` row-major where that lets cuBLAS batch a product in one call (CUDA).
pub(super) fn dense<B: Backend>(t: Tensor<B, 4>) -> Tensor<B, 4> {
    #[cfg(feature = "cuda")]
    return super::cuda::dense(t);
    #[cfg(not(feature = "cuda"))]
    t
}

/// A tile's softmax in one kernel where there is one (CUDA): the
/// probabilities and each row's log-sum-exp in f32.
fn fused_softmax<B: Backend>(
    scores: &Tensor<B, 4>,
    block: &QueryBlock<B>,
    tile: KeyTile,
) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
    #[cfg(feature = "cuda")]
    return super::cuda::softmax_forward(scores, block.offset(tile), block.len);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (scores, block, tile);
        None
    }
}

/// A tile's softmax gradient in one kernel where there is one (CUDA): the
/// probabilities and the scores' gradient.
fn fused_softmax_grad<B: Backend>(
    [scores, dprobs, lse, row_dot]: [&Tensor<B, 4>; 4],
    block: &QueryBlock<B>,
    tile: KeyTile,
) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
    #[cfg(feature = "cuda")]
    return super::cuda::softmax_backward(
        scores,
        dprobs,
        lse,
        row_dot,
        block.offset(tile),
        block.len,
    );
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (scores, dprobs, lse, row_dot, block, tile);
        None
    }
}

/// Two tiles' outputs of the same queries, each with its rows' log-sum-exp,
/// as one: each weighted by its share of the joint softmax's denominator.
/// The first is an f32 sum (output and log-sum-exp); so is the result.
fn combine<B: Backend>(
    (sum, sum_lse): (Tensor<B, 4>, Tensor<B, 4>),
    (part, part_lse): (Tensor<B, 4>, Tensor<B, 4>),
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    #[cfg(feature = "cuda")]
    if let Some(fused) = super::cuda::combine(&sum, &sum_lse, &part, &part_lse) {
        return fused;
    }
    let part_lse = cast_to(part_lse, DType::F32);
    let max = sum_lse.clone().max_pair(part_lse.clone());
    let (a, b) = (
        (sum_lse - max.clone()).exp(),
        (part_lse - max.clone()).exp(),
    );
    let total = a.clone() + b.clone();
    let output = (sum * a + cast_to(part, DType::F32) * b) / total.clone();
    (output, max + total.log())
}

/// `sum + part` in `sum`'s dtype (`part` itself, cast, when there is no sum).
pub(super) fn accumulate<B: Backend>(
    sum: Option<Tensor<B, 4>>,
    part: Tensor<B, 4>,
    dtype: DType,
) -> Tensor<B, 4> {
    match sum {
        None => cast_to(part, dtype),
        Some(sum) => {
            #[cfg(feature = "cuda")]
            if let Some(fused) = super::cuda::accumulate(&sum, &part) {
                return fused;
            }
            sum + cast_to(part, dtype)
        }
    }
}

/// Runs `f` on each chunk of sequences of the tensors and joins the results
/// along the batch (no copies when one chunk holds the batch).
pub(super) fn by_chunks<B: Backend, const N: usize, const M: usize>(
    inputs: [Tensor<B, 4>; N],
    chunk: usize,
    f: impl Fn([Tensor<B, 4>; N]) -> [Tensor<B, 4>; M],
) -> [Tensor<B, 4>; M] {
    let batch = inputs[0].dims()[0];
    if chunk >= batch {
        return f(inputs);
    }
    let mut parts: [Vec<Tensor<B, 4>>; M] = std::array::from_fn(|_| Vec::new());
    for start in (0..batch).step_by(chunk) {
        let len = chunk.min(batch - start);
        let outputs = f(std::array::from_fn(|i| {
            inputs[i].clone().narrow(0, start, len)
        }));
        for (part, output) in parts.iter_mut().zip(outputs) {
            part.push(output);
        }
    }
    parts.map(|p| Tensor::cat(p, 0))
}

/// One key tile's share of a query block's output, `[b, kv, g·len, d]`, and
/// the rows' log-sum-exp over the tile's keys.
fn tile_forward<B: Backend>(
    [q, k, v]: [Tensor<B, 4>; 3],
    scale: f64,
    block: &QueryBlock<B>,
    tile: KeyTile,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let scores = scaled_scores(q, k, scale);
    if let Some((probs, lse)) = fused_softmax(&scores, block, tile) {
        return (probs.matmul(v), lse);
    }
    let scores = if block.masks(tile) {
        masked(scores, block)
    } else {
        scores
    };
    let max = scores.clone().max_dim(3);
    let weights = (scores - max.clone()).exp();
    let sums = weights.clone().sum_dim(3);
    (weights.matmul(v) / sums.clone(), max + sums.log())
}

/// The forward: the output in the grouped layout `[b, kv, g·s, d]` and each
/// row's log-sum-exp `[b, kv, g·s, 1]` (what the backward needs).
fn attention_forward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    passes: Passes,
    window: Option<usize>,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let [_, heads, seq, head_dim] = q.dims();
    let passes = match passes {
        Passes::Cudnn => {
            #[cfg(feature = "cuda")]
            if let Some((output, lse)) = super::cudnn::forward(&q, &k, &v, window) {
                let kv_heads = k.dims()[1];
                return (grouped(output, kv_heads), grouped(lse, kv_heads));
            }
            after_cudnn(heads, seq, head_dim, q.dtype(), window)
        }
        passes => passes,
    };
    // `Auto` is resolved before a pass runs; as a fallback it is `Fused`.
    let tiling = match passes {
        Passes::Tiled(tiling) => tiling,
        Passes::Auto | Passes::Cudnn | Passes::Fused | Passes::FusedForward(_) => {
            #[cfg(feature = "cuda")]
            if let Some((output, lse)) = super::flash::forward(&q, &k, &v, window) {
                let kv_heads = k.dims()[1];
                return (grouped(output, kv_heads), grouped(lse, kv_heads));
            }
            Tiling::new(heads, seq)
        }
    };
    // `resolved` sends a window only to the fused kernels.
    assert!(window.is_none(), "attention: the tiles have no window mask");
    let groups = heads / k.dims()[1];
    let scale = 1.0 / (head_dim as f64).sqrt();
    let dtype = q.dtype();
    let q = grouped(q, k.dims()[1]);
    let (k, v) = (dense(k), dense(v));
    let blocks = QueryBlock::cover(seq, &tiling, &k.device());
    let [output, lse] = by_chunks([q, k, v], tiling.chunk, |[q, k, v]| {
        let (mut outputs, mut lses) = (Vec::new(), Vec::new());
        for block in &blocks {
            let q = query_rows(&q, seq, block.start, block.len);
            let mut sum: Option<(Tensor<B, 4>, Tensor<B, 4>)> = None;
            for tile in block.tiles() {
                let keys = |x: &Tensor<B, 4>| x.clone().narrow(2, tile.start, tile.len);
                let part = tile_forward([q.clone(), keys(&k), keys(&v)], scale, block, tile);
                sum = Some(match sum {
                    None => part,
                    // Several tiles: their sum is kept in f32.
                    Some((o, lse)) if o.dtype() != DType::F32 => {
                        let first = (cast_to(o, DType::F32), cast_to(lse, DType::F32));
                        combine(first, part)
                    }
                    Some(first) => combine(first, part),
                });
            }
            let (output, lse) = sum.expect("a query block sees at least one key");
            outputs.push(cast_to(output, dtype));
            // Combined log-sum-exps are f32; the blocks' must agree.
            lses.push(cast_to(lse, DType::F32));
        }
        [join_rows(outputs, groups), join_rows(lses, groups)]
    });
    (output, lse)
}

/// The backward: `(dq, dk, dv)` for the output gradient `grad` in the grouped
/// layout, from the forward's inputs, output and log-sum-exp. Key tiles go
/// one at a time: the blocks that see a tile add to its key and value
/// gradients, and each block's query gradient sums its tiles'.
fn attention_backward<B: Backend>(
    [q, k, v, output, lse]: [Tensor<B, 4>; 5],
    grad: Tensor<B, 4>,
    passes: Passes,
    window: Option<usize>,
) -> [Tensor<B, 4>; 3] {
    let [batch, heads, seq, head_dim] = q.dims();
    let passes = match passes {
        Passes::Cudnn => {
            #[cfg(feature = "cuda")]
            {
                let heads_of = |t: &Tensor<B, 4>, w| t.clone().reshape([batch, heads, seq, w]);
                let (output4, grad4) = (heads_of(&output, head_dim), heads_of(&grad, head_dim));
                let inputs = [&q, &k, &v, &output4, &grad4];
                if let Some(grads) = super::cudnn::backward(inputs, &heads_of(&lse, 1), window) {
                    return grads;
                }
            }
            after_cudnn(heads, seq, head_dim, q.dtype(), window)
        }
        passes => passes,
    };
    let tiling = match passes {
        Passes::Tiled(tiling) | Passes::FusedForward(tiling) => tiling,
        Passes::Auto | Passes::Cudnn | Passes::Fused => {
            #[cfg(feature = "cuda")]
            {
                let heads_of = |t: &Tensor<B, 4>, w| t.clone().reshape([batch, heads, seq, w]);
                let (output, grad4) = (heads_of(&output, head_dim), heads_of(&grad, head_dim));
                let dot =
                    (cast_to(grad4.clone(), DType::F32) * cast_to(output, DType::F32)).sum_dim(3);
                let lse = heads_of(&lse, 1);
                let inputs = [&q, &k, &v, &grad4];
                if let Some(grads) = super::flash::backward(inputs, &lse, &dot, window) {
                    return grads;
                }
            }
            Tiling::new(heads, seq)
        }
    };
    assert!(window.is_none(), "attention: the tiles have no window mask");
    let groups = heads / k.dims()[1];
    let scale = 1.0 / (head_dim as f64).sqrt();
    let dtype = q.dtype();
    // The gradients are sums of the blocks' and tiles' parts. A sum of at
    // most a sequence's `QUERY_BLOCKS` parts stays in the compute dtype (in
    // f32 the 0.85B's bf16 backward at 1024 tokens a sequence took 5% more
    // time); longer sums are kept in f32 (in bf16, a sum over the 128
    // blocks of a 256k sequence would round 128 times).
    let sum_dtype = if tiling.tiles_keys(seq) || seq.div_ceil(tiling.block) > QUERY_BLOCKS {
        DType::F32
    } else {
        dtype
    };
    let q = grouped(q, k.dims()[1]);
    let (k, v) = (dense(k), dense(v));
    let blocks = QueryBlock::cover(seq, &tiling, &k.device());
    let [dq, dk, dv] = by_chunks(
        [q, k, v, output, lse, grad],
        tiling.chunk,
        |[q, k, v, output, lse, grad]| {
            let row_dot = (grad.clone() * output).sum_dim(3);
            let mut dqs: Vec<Option<Tensor<B, 4>>> = vec![None; blocks.len()];
            let (mut dks, mut dvs) = (Vec::new(), Vec::new());
            for first_key in (0..seq).step_by(tiling.key_tile) {
                // The last block sees every key of the tile, so its key and
                // value gradients start the sums the earlier blocks add their
                // leading rows to; a block before one that does not see the
                // tile does not either.
                let (mut dk, mut dv): (Option<Tensor<B, 4>>, Option<Tensor<B, 4>>) = (None, None);
                for (i, block) in blocks.iter().enumerate().rev() {
                    let Some(tile) = block.tile_at(first_key) else {
                        break;
                    };
                    let rows = |x: &Tensor<B, 4>| query_rows(x, seq, block.start, block.len);
                    let keys = |x: &Tensor<B, 4>| x.clone().narrow(2, tile.start, tile.len);
                    let (q, grad, k, v) = (rows(&q), rows(&grad), keys(&k), keys(&v));
                    // The forward's probabilities, recomputed (masked entries: exp(−∞) = 0).
                    let scores = scaled_scores(q.clone(), k.clone(), scale);
                    let dprobs = grad.clone().matmul(v.swap_dims(2, 3));
                    let (lse, row_dot) = (rows(&lse), rows(&row_dot));
                    let fused = fused_softmax_grad([&scores, &dprobs, &lse, &row_dot], block, tile);
                    let (probs, dscores) = match fused {
                        Some(fused) => fused,
                        None => {
                            // A fused or combined forward keeps its log-sum-exp in f32.
                            let lse = cast_to(lse, scores.dtype());
                            let scores = if block.masks(tile) {
                                masked(scores, block)
                            } else {
                                scores
                            };
                            let probs = (scores - lse).exp();
                            (probs.clone(), probs * (dprobs - row_dot))
                        }
                    };
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
                dks.push(dk.expect("the last block sees every tile"));
                dvs.push(dv.expect("the last block sees every tile"));
            }
            let dqs = dqs
                .into_iter()
                .map(|dq| dq.expect("every block sees a tile"))
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

/// `sum` with `part` added to its leading rows (dimension 2), in `dtype`;
/// `part` itself when there is no sum yet.
pub(super) fn add_leading<B: Backend>(
    sum: Option<Tensor<B, 4>>,
    part: Tensor<B, 4>,
    dtype: DType,
) -> Tensor<B, 4> {
    let Some(sum) = sum else {
        return cast_to(part, dtype);
    };
    if sum.dims() == part.dims() {
        return accumulate(Some(sum), part, dtype);
    }
    let [b, kv, rows, w] = part.dims();
    let ranges = [0..b, 0..kv, 0..rows, 0..w];
    let leading = accumulate(Some(sum.clone().slice(ranges.clone())), part, dtype);
    sum.slice_assign(ranges, leading)
}

#[derive(Debug)]
struct CausalAttention {
    passes: Passes,
    window: Option<usize>,
}

impl<B: Backend> Backward<B, 3> for CausalAttention {
    /// `q`, `k`, `v`, the grouped output and its log-sum-exp.
    type State = [FloatTensor<B>; 5];

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        backward_each::<B, _, 3>(ops, grads, |state, grad| {
            let saved = state.map(tensor::<B, 4>);
            let grad = grouped(tensor::<B, 4>(grad), saved[1].dims()[1]);
            attention_backward(saved, grad, self.passes, self.window).map(float)
        });
    }
}

/// [`causal_attention`] on `Autodiff<B>` as one operation.
fn tracked<B: Backend>(
    q: Tensor<Autodiff<B>, 4>,
    k: Tensor<Autodiff<B>, 4>,
    v: Tensor<Autodiff<B>, 4>,
    passes: Passes,
    window: Option<usize>,
) -> Tensor<Autodiff<B>, 4> {
    let [batch, heads, seq, head_dim] = q.dims();
    let Some(passes) = resolved(passes, &q.clone().inner(), window) else {
        return reference_attention(q, k, v, window);
    };
    let kv_heads = k.dims()[1];
    let (q, k, v) = (float(q), float(k), float(v));
    // In a recompute, the output its graph-free forward kept (`memo`).
    let rows = heads / kv_heads * seq;
    let kept = memo::kept::<B>(
        [batch, kv_heads, rows, head_dim],
        [batch, kv_heads, rows, 1],
    );
    let (output, lse) = kept.unwrap_or_else(|| {
        attention_forward::<B>(
            tensor(q.primitive.clone()),
            tensor(k.primitive.clone()),
            tensor(v.primitive.clone()),
            passes,
            window,
        )
    });
    let result = float(output.clone().reshape([batch, heads, seq, head_dim]));
    let op = CausalAttention { passes, window };
    tensor(record(op, [q, k, v], result, |[q, k, v]| {
        [q, k, v, float(output), float(lse)]
    }))
}

/// Causal attention in tensor ops, for any backend: burn differentiates it op
/// by op, keeping the `[batch, heads, seq, seq]` weights for the backward.
/// The formulation keeps the score-sized passes few: the scale goes on `q`,
/// the max shift is detached (burn's `attention_fallback` differentiates
/// through it), and the weights stay unnormalised: they multiply `[v | 1]`,
/// so one matmul gives both the weighted sum and the row sums, and the
/// division happens on the `[b, h, s, d]` output.
pub fn reference_causal_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    reference_attention(q, k, v, None)
}

/// [`reference_causal_attention`] with [`windowed_attention`]'s sliding
/// window: each position sees itself and the `window − 1` before it.
///
/// # Panics
/// As [`causal_attention`], and if `window` is 0.
pub fn reference_windowed_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    window: usize,
) -> Tensor<B, 4> {
    assert!(window > 0, "attention: a window of 0 positions");
    reference_attention(q, k, v, Some(window))
}

fn reference_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    window: Option<usize>,
) -> Tensor<B, 4> {
    reference_masked(q, k, v, window, None)
}

/// [`reference_attention`] with the keys `extra` (`[batch, 1, seq, seq]`,
/// `true` where a query must not see a key) masked as well: the documents
/// of packed windows (`packed.rs`).
pub(super) fn reference_masked<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    window: Option<usize>,
    extra: Option<Tensor<B, 4, Bool>>,
) -> Tensor<B, 4> {
    check_shapes(&q, &k, &v);
    let [batch, heads, seq, head_dim] = q.dims();
    let (k, v) = (repeat_kv(k, heads), repeat_kv(v, heads));
    let device = q.device();
    let q = q * (1.0 / (head_dim as f64).sqrt());
    let scores = q.matmul(k.swap_dims(2, 3));
    let mut hidden = Tensor::<B, 2, Bool>::tril_mask([seq, seq], 0, &device);
    if let Some(window) = window {
        // Keys `window` or more positions back: j < i − window + 1.
        let past = Tensor::triu_mask([seq, seq], 1 - window as i64, &device);
        hidden = hidden.bool_or(past);
    }
    let mut hidden = hidden.unsqueeze::<4>().expand([batch, heads, seq, seq]);
    if let Some(more) = extra {
        hidden = hidden.bool_or(more.expand([batch, heads, seq, seq]));
    }
    let scores = scores.mask_fill(hidden, f32::NEG_INFINITY);
    let max = scores.clone().detach().max_dim(3);
    let weights = (scores - max).exp();
    // `[v | 1 | 0…]`: the ones column yields the row sums; the zero columns
    // pad the width to a multiple of 16 so the matmul keeps aligned tiles.
    let width = (head_dim + 1).next_multiple_of(16);
    let dtype = v.dtype();
    let ones = Tensor::<B, 4>::ones([batch, heads, seq, 1], (&device, dtype));
    let mut columns = vec![v, ones];
    if width > head_dim + 1 {
        let pad = [batch, heads, seq, width - head_dim - 1];
        columns.push(Tensor::zeros(pad, (&device, dtype)));
    }
    let summed = weights.matmul(Tensor::cat(columns, 3));
    let row_sums = summed.clone().narrow(3, head_dim, 1);
    summed.narrow(3, 0, head_dim) / row_sums
}

/// Each key/value head repeated for the query heads it serves.
fn repeat_kv<B: Backend>(x: Tensor<B, 4>, heads: usize) -> Tensor<B, 4> {
    let [batch, kv, seq, head_dim] = x.dims();
    if kv == heads {
        return x;
    }
    x.unsqueeze_dim::<5>(2)
        .expand([batch, kv, heads / kv, seq, head_dim])
        .reshape([batch, heads, seq, head_dim])
}

#[cfg(test)]
mod tests;
