//! Generation with a key/value cache: each block keeps the keys and values
//! of the positions it has seen on the device, so a prompt is run once
//! (prefill) and each new token is one position through the model (decode),
//! attending to the cached ones, instead of the whole sequence again.
//!
//! [`KvCache`] holds one [`LayerCache`] per block: keys and values
//! `[batch, kv_heads, capacity, head_dim]`, allocated once (in the dtype
//! and on the device of the first keys written) and written in place at
//! each new position. The families supply their blocks' cached forwards
//! ([`CachedBlock`]) and their embedding at an offset ([`CachedModel`]);
//! [`CachedModel::forward_cached`] runs them as one model.

use burn::tensor::activation::softmax;
use burn::tensor::{backend::Backend, DType, Int, Tensor, TensorData};
use burn_offload::ops::attention::{causal_attention, single_query_attention, windowed_attention};
use burn_offload::{cast_to, BlockModel};

/// The keys and values of one block, for positions `0..len` of a
/// [`KvCache`].
#[derive(Debug, Clone)]
pub struct LayerCache<B: Backend> {
    /// `(keys, values)`, each `[batch, kv_heads, capacity, head_dim]`;
    /// `None` until the first append.
    kv: Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    /// Positions to allocate on the first append (more if it writes more).
    capacity: usize,
}

impl<B: Backend> LayerCache<B> {
    fn new(capacity: usize) -> Self {
        Self { kv: None, capacity }
    }

    /// Writes `k` and `v` (`[batch, kv_heads, n, head_dim]`) at positions
    /// `start..start + n` and returns the keys and values of positions
    /// `0..start + n`. The buffers are written in place where nothing else
    /// holds them (the views returned by the last call are gone); a write past
    /// the capacity moves them into buffers twice as long.
    pub fn append(
        &mut self,
        start: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let [batch, heads, n, head_dim] = k.dims();
        let end = start + n;
        let (keys, values) = match self.kv.take() {
            Some((keys, values)) if keys.dims()[2] >= end => (keys, values),
            held => {
                let capacity = self
                    .capacity
                    .max(end)
                    .max(2 * held.as_ref().map_or(0, |h| h.0.dims()[2]));
                let empty = || {
                    Tensor::<B, 4>::zeros([batch, heads, capacity, head_dim], &k.device())
                        .cast(k.dtype())
                };
                let (keys, values) = (empty(), empty());
                match held {
                    // Positions at or past `start` are overwritten below.
                    Some((old_k, old_v)) if start > 0 => {
                        let kept = [0..batch, 0..heads, 0..start, 0..head_dim];
                        (
                            keys.slice_assign(kept.clone(), old_k.narrow(2, 0, start)),
                            values.slice_assign(kept, old_v.narrow(2, 0, start)),
                        )
                    }
                    _ => (keys, values),
                }
            }
        };
        let at = [0..batch, 0..heads, start..end, 0..head_dim];
        let keys = keys.slice_assign(at.clone(), k);
        let values = values.slice_assign(at, v);
        let seen = (
            keys.clone().narrow(2, 0, end),
            values.clone().narrow(2, 0, end),
        );
        self.kv = Some((keys, values));
        seen
    }
}

/// Every block's [`LayerCache`] and the number of positions they hold.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    len: usize,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `layers` blocks that allocates room for
    /// `capacity` positions (it grows if asked for more).
    pub fn new(layers: usize, capacity: usize) -> Self {
        Self {
            layers: (0..layers).map(|_| LayerCache::new(capacity)).collect(),
            len: 0,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position from `len` on (the next forward overwrites
    /// them): a conversation that is rendered again from where it changed.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The blocks' caches, to run blocks one by one (as a streamed model
    /// does); [`KvCache::advance`] then counts the positions they took.
    pub fn layers_mut(&mut self) -> &mut [LayerCache<B>] {
        &mut self.layers
    }

    /// Counts `n` positions appended to every block's cache.
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

/// A decoder block that attends to the cached keys and values of the
/// positions before its input.
pub trait CachedBlock<B: Backend> {
    /// The block's forward of `x: [batch, n, d]` at positions
    /// `start..start + n`, its keys and values appended to `cache`.
    fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        start: usize,
    ) -> Tensor<B, 3>;
}

/// A model that generates with a [`KvCache`]: Llama's family and GPT-2.
pub trait CachedModel<B: Backend>: BlockModel<B, Block: CachedBlock<B>> {
    /// [`BlockModel::embed`] of tokens at positions `start..` (learned
    /// positions, where the model has them, count from `start`).
    fn embed_at(&self, tokens: Tensor<B, 2, Int>, start: usize) -> Tensor<B, 3>;

    /// An empty cache for this model, with room for `capacity` positions.
    fn new_cache(&self, capacity: usize) -> KvCache<B> {
        KvCache::new(self.blocks().len(), capacity)
    }

    /// Logits `[batch, vocab]` of the last of `tokens: [batch, n]`, which
    /// follow the positions `cache` holds; their keys and values join it.
    fn forward_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Tensor<B, 2> {
        let [batch, n] = tokens.dims();
        let start = cache.len();
        let x = self.embed_at(tokens, start);
        let x = self
            .blocks()
            .iter()
            .zip(cache.layers_mut())
            .fold(x, |x, (block, layer)| block.forward_cached(x, layer, start));
        cache.advance(n);
        let logits = self.head(x.narrow(1, n - 1, 1));
        let vocab = logits.dims()[2];
        logits.reshape([batch, vocab])
    }
}

/// Attention of `q: [batch, heads, n, head_dim]` at positions
/// `start..start + n` over the positions before it and itself, where
/// `k` and `v` (`[batch, kv_heads, n, head_dim]`, grouped-query heads as
/// in [`causal_attention`]) join `cache`; with `window`, each position sees
/// at most that many (itself included). A first pass (`start` 0) is the
/// uncached forward's attention; later ones attend to the cache.
pub fn cached_attention<B: Backend>(
    cache: &mut LayerCache<B>,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    start: usize,
    window: Option<usize>,
) -> Tensor<B, 4> {
    let (keys, values) = cache.append(start, k.clone(), v.clone());
    if start == 0 {
        drop((keys, values));
        return match window {
            Some(window) => windowed_attention(q, k, v, window),
            None => causal_attention(q, k, v),
        };
    }
    attend(q, keys, values, start, window)
}

/// Attention of `q` at positions `start..start + n` over `keys` and
/// `values` of positions `0..start + n`: each key/value head serves its
/// group of consecutive query heads as one matmul (the keys are never
/// repeated), the scores in f32.
fn attend<B: Backend>(
    q: Tensor<B, 4>,
    keys: Tensor<B, 4>,
    values: Tensor<B, 4>,
    start: usize,
    window: Option<usize>,
) -> Tensor<B, 4> {
    let [batch, heads, n, head_dim] = q.dims();
    let kv_heads = keys.dims()[1];
    let group = heads / kv_heads;
    // The first key any of these queries sees.
    let first = window.map_or(0, |w| (start + 1).saturating_sub(w));
    let seen = start + n - first;
    let (keys, values) = (keys.narrow(2, first, seen), values.narrow(2, first, seen));
    if n == 1 {
        // A decode step: every key kept is visible.
        return single_query_attention(q, keys, values);
    }
    let q = q.reshape([batch, kv_heads, group * n, head_dim]);
    let scores = q.matmul(keys.swap_dims(2, 3));
    let scores = cast_to(scores, DType::F32) * (1.0 / (head_dim as f64).sqrt());
    // Row r is query r mod n: the earlier queries see fewer keys.
    let scores = {
        let mut bias = Vec::with_capacity(group * n * seen);
        for r in 0..group * n {
            let at = start + r % n;
            for key in first..start + n {
                let visible = key <= at && window.is_none_or(|w| at - key < w);
                bias.push(if visible { 0.0f32 } else { f32::NEG_INFINITY });
            }
        }
        let bias =
            Tensor::<B, 2>::from_data(TensorData::new(bias, [group * n, seen]), &scores.device());
        scores + bias.unsqueeze::<4>()
    };
    let weights = cast_to(softmax(scores, 3), values.dtype());
    weights.matmul(values).reshape([batch, heads, n, head_dim])
}
