//! Attention of one new position over the cached keys and values: the step
//! of generation that runs once a token for every block, where the work is
//! small and the kernel launches are what it costs. In tensor ops it is a
//! dozen kernels (the scores, their cast and scale, the five of a softmax,
//! the weights' cast, the weighted sum); on CUDA it is one
//! (`decode_cuda.rs`).

use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

use crate::precision::cast_to;

/// `softmax(q·kᵀ / √d) · v` for one query position, `q: [batch, heads, 1,
/// d]`, over every one of the keys and values `[batch, kv_heads, keys, d]`
/// (views of a cache, read through their strides), each key/value head
/// serving `heads / kv_heads` consecutive query heads; the scores and the
/// softmax in f32, the output `[batch, heads, 1, d]` in `q`'s dtype.
///
/// # Panics
/// If the shapes disagree, `heads` is not a multiple of `kv_heads`, or
/// there is no key.
pub fn single_query_attention<B: Backend>(
    q: Tensor<B, 4>,
    keys: Tensor<B, 4>,
    values: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let [batch, heads, n, head_dim] = q.dims();
    let [kv_batch, kv_heads, seen, kv_dim] = keys.dims();
    assert!(
        n == 1
            && seen > 0
            && keys.dims() == values.dims()
            && [kv_batch, kv_dim] == [batch, head_dim]
            && kv_heads > 0
            && heads.is_multiple_of(kv_heads),
        "single-query attention: q {:?}, keys {:?}, values {:?}",
        q.dims(),
        keys.dims(),
        values.dims()
    );
    #[cfg(feature = "cuda")]
    if let Some(out) = super::decode_cuda::single_query(&q, &keys, &values) {
        return out;
    }
    let group = heads / kv_heads;
    // Each key/value head's group of query heads as the rows of one matmul.
    let q = q.reshape([batch, kv_heads, group, head_dim]);
    let scores = cast_to(q.matmul(keys.swap_dims(2, 3)), DType::F32);
    let weights = softmax(scores * (1.0 / (head_dim as f64).sqrt()), 3);
    cast_to(weights, values.dtype())
        .matmul(values)
        .reshape([batch, heads, 1, head_dim])
}
