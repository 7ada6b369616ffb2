//! The contract between a decoder model and the offload engine.
//!
//! The engine never runs a model as one opaque `forward`: it embeds the tokens,
//! runs the blocks one at a time (so only one block's weights and activations
//! need to be on the device), and applies the head in chunks of tokens (so the
//! `tokens × vocab` logits never exist at once). A model exposes exactly those
//! three stages and nothing else.
//!
//! Requirements an implementation must meet for the engine to be correct:
//! - `forward(tokens) == head(blocks[L-1](… blocks[0](embed(tokens))))`;
//! - [`BlockModel::head`] acts on each token position independently (final norm
//!   and LM projection), so applying it to a slice of positions gives the same
//!   rows as applying it to all of them;
//! - each block maps `[batch, seq, d_model] → [batch, seq, d_model]` and reads
//!   nothing but its input and its own parameters (no cross-block state);
//! - the same holds with [`Documents`]: `forward_in` and `embed_in` see the
//!   packed windows' boundaries, and a position depends only on its own
//!   document (attention masked across boundaries, positions counted from
//!   each document's start).

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Int, Tensor};

use crate::documents::Documents;

/// One transformer block: `[batch, seq, d_model] → [batch, seq, d_model]`.
pub trait DecoderBlock<B: Backend>: Module<B> {
    /// Applies the block to the hidden states `x`.
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3>;

    /// Applies the block to `x`, whose rows hold the packed `documents`
    /// (`[batch, seq]`, as `x`'s): no position sees another document's, and
    /// positions (rotary ones, say) count from each document's start. With
    /// one document a row it is [`DecoderBlock::forward`]. Required, not
    /// defaulted: a block that mixes positions must say how it keeps
    /// documents apart.
    fn forward_in(&self, x: Tensor<B, 3>, documents: &Documents) -> Tensor<B, 3>;
}

/// A decoder language model seen as `embed → blocks → head`.
pub trait BlockModel<B: Backend>: Module<B> {
    /// The model's transformer block.
    type Block: DecoderBlock<B>;

    /// Token ids `[batch, seq]` → hidden states `[batch, seq, d_model]`
    /// (token embedding, plus learned positions where the model has them).
    fn embed(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3>;

    /// [`BlockModel::embed`] of tokens packed as `documents`: learned
    /// positions, where the model has them, count from each document's
    /// start.
    fn embed_in(&self, tokens: Tensor<B, 2, Int>, documents: &Documents) -> Tensor<B, 3>;

    /// The blocks, in order.
    fn blocks(&self) -> &[Self::Block];

    /// Hidden states `[batch, seq, d_model]` → logits `[batch, seq, vocab]`
    /// (final norm and LM head); position-wise.
    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3>;

    /// Vocabulary size of the head.
    fn vocab_size(&self) -> usize;

    /// The token-embedding table `[vocab, d_model]`, where
    /// [`BlockModel::embed`] is exactly a row lookup in it and reads no other
    /// parameter. The engine then forms the table's gradient on the host, a
    /// scatter-add of the hidden-state gradient's rows, and leaves the stem
    /// off the device for the embedding's backward (burn's CUDA
    /// `embedding_backward` runs one thread per column over every token).
    /// `None`, the default: burn differentiates `embed`.
    fn embedding_table(&self) -> Option<&Param<Tensor<B, 2>>> {
        None
    }

    /// The whole model: token ids `[batch, seq]` → logits `[batch, seq, vocab]`.
    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let hidden = self
            .blocks()
            .iter()
            .fold(self.embed(tokens), |x, block| block.forward(x));
        self.head(hidden)
    }

    /// [`BlockModel::forward`] of tokens packed as `documents`: each
    /// document's logits are those it has alone.
    fn forward_in(&self, tokens: Tensor<B, 2, Int>, documents: &Documents) -> Tensor<B, 3> {
        let hidden = self
            .blocks()
            .iter()
            .fold(self.embed_in(tokens, documents), |x, block| {
                block.forward_in(x, documents)
            });
        self.head(hidden)
    }
}
