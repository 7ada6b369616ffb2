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

use std::sync::atomic::{AtomicBool, Ordering};

use burn::module::{Module, Param};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{backend::Backend, Int, Tensor};

use crate::backend::OffloadWith;
use crate::documents::Documents;
use crate::transfer::Transfer;

/// One transformer block: `[batch, seq, d_model] → [batch, seq, d_model]`.
/// (`'static`: a checkpoint keeps a clone of the block until the backward.)
pub trait DecoderBlock<B: Backend>: Module<B> + 'static {
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
    /// Each block runs through [`BlockRecompute::run_block`]: on
    /// `Autodiff<Offload<_>>` as a checkpoint, recomputed in the backward.
    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3>
    where
        B: BlockRecompute,
    {
        let hidden = self
            .blocks()
            .iter()
            .fold(self.embed(tokens), |x, block| B::run_block(block, x, None));
        self.head(hidden)
    }

    /// [`BlockModel::forward`] of tokens packed as `documents`: each
    /// document's logits are those it has alone.
    fn forward_in(&self, tokens: Tensor<B, 2, Int>, documents: &Documents) -> Tensor<B, 3>
    where
        B: BlockRecompute,
    {
        let hidden = self
            .blocks()
            .iter()
            .fold(self.embed_in(tokens, documents), |x, block| {
                B::run_block(block, x, Some(documents))
            });
        self.head(hidden)
    }
}

/// A block's forward, in or out of packed documents.
pub(crate) fn forward_block<B: Backend, M: DecoderBlock<B>>(
    block: &M,
    x: Tensor<B, 3>,
    documents: Option<&Documents>,
) -> Tensor<B, 3> {
    match documents {
        Some(documents) => block.forward_in(x, documents),
        None => block.forward(x),
    }
}

/// How a backend runs a model's blocks: as they are (every method's
/// default), or, on `Autodiff` over a backend that asks for it
/// ([`BlockRecompute::recompute_blocks`], as `Offload` does), each as a
/// checkpoint ([`crate::recompute`]) that keeps only its input and rebuilds
/// its graph in the backward, so a plain burn loop holds one block's
/// activations at a time.
///
/// Implemented for the backends this crate builds with; another backend
/// takes part with `impl BlockRecompute for MyBackend {}` (stable Rust has no
/// specialization, so the capability is a trait with defaults).
pub trait BlockRecompute: Backend {
    /// Whether `Autodiff<Self>` runs a model's blocks as checkpoints now.
    fn recompute_blocks() -> bool {
        false
    }

    /// Applies `block` to `x` (in `documents`, where given), as a checkpoint
    /// where this backend recomputes blocks.
    fn run_block<M: DecoderBlock<Self>>(
        block: &M,
        x: Tensor<Self, 3>,
        documents: Option<&Documents>,
    ) -> Tensor<Self, 3> {
        forward_block(block, x, documents)
    }

    /// `f(module, x)`; on `Autodiff` the checkpoint operation of
    /// [`crate::recompute`].
    fn recompute<M, F, const D: usize>(module: &M, x: Tensor<Self, D>, f: F) -> Tensor<Self, D>
    where
        M: Module<Self> + 'static,
        F: Fn(&M, Tensor<Self, D>) -> Tensor<Self, D> + Send + Sync + 'static,
    {
        f(module, x)
    }

    /// Where a checkpoint keeps its input until the backward (`Offload`:
    /// host memory, the copy queued behind the kernels that make it).
    fn stash(x: FloatTensor<Self>) -> FloatTensor<Self> {
        x
    }

    /// A stashed input back where operations read it (`Offload`: uploaded
    /// once, outside the page cache).
    fn unstash(x: FloatTensor<Self>) -> FloatTensor<Self> {
        x
    }

    /// Where a checkpoint's parameter gradient waits for the optimizer
    /// (`Offload`: host memory, its device buffer released once the queued
    /// copy has landed).
    fn release_gradient(gradient: FloatTensor<Self>) -> FloatTensor<Self> {
        gradient
    }

    /// The position of the backend's random draws, where it can rewind them
    /// (`Offload`'s host draws), so a recomputed block draws the masks its
    /// forward drew.
    fn draws() -> Option<u64> {
        None
    }

    /// Sets the position of the random draws (see [`BlockRecompute::draws`]).
    fn rewind_draws(_position: u64) {}
}

impl BlockRecompute for burn::backend::Flex {}

impl<B: crate::backend::GemmKernels> BlockRecompute for crate::backend::Gemm<B> {}

#[cfg(feature = "cuda")]
impl BlockRecompute for crate::cuda::CudaBackend {}

static OFFLOAD_RECOMPUTE: AtomicBool = AtomicBool::new(true);

/// Whether `Autodiff<Offload<_>>` runs a model's blocks as checkpoints (on
/// by default): off, the whole step's graph stays on the device, which is
/// faster where it fits (no second forward, no copies of block inputs and
/// gradients to host memory); the `train` program's plan turns it off there.
pub fn set_offload_recompute(on: bool) {
    OFFLOAD_RECOMPUTE.store(on, Ordering::Relaxed);
}

impl<B: Backend, T: Transfer> BlockRecompute for OffloadWith<B, T> {
    fn recompute_blocks() -> bool {
        OFFLOAD_RECOMPUTE.load(Ordering::Relaxed)
    }

    fn stash(x: FloatTensor<Self>) -> FloatTensor<Self> {
        crate::backend::park_queued::<B, T>(x)
    }

    fn unstash(x: FloatTensor<Self>) -> FloatTensor<Self> {
        crate::backend::to_device_uncached(x)
    }

    fn release_gradient(gradient: FloatTensor<Self>) -> FloatTensor<Self> {
        crate::backend::park_queued::<B, T>(gradient)
    }

    fn draws() -> Option<u64> {
        Some(crate::backend::host_draws())
    }

    fn rewind_draws(position: u64) {
        crate::backend::rewind_host_draws(position)
    }
}
