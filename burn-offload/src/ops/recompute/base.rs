//! The checkpoint operation behind [`recompute`].
//!
//! Forward: `f` runs on untracked copies of the module's parameters and of
//! the input, so it records no graph and keeps no activation; one operation
//! is recorded with the input as its only parent, keeping the input (in host
//! memory on `Offload`) and a clone of the module (host `Arc`s on `Offload`).
//!
//! Backward: the input and every trained parameter become fresh leaves, `f`
//! runs again on them (the weights paged in again, in the order the forward
//! read them, so the prefetch trace replays), and a nested `backward()` of
//! `y ⊙ dy` gives the input's and the parameters' gradients. The nested graph,
//! and with it the block's activations, is dropped before the next block's
//! step. Parameter gradients are registered under the parameters' own node
//! ids, where `GradientsParams::from_grads` looks for them, after
//! `BlockRecompute::release_gradient` (host memory on `Offload`).
//!
//! The nested `backward()` needs the vendored burn-autodiff's fix of
//! tracel-ai/burn#5193 (vendor/burn-autodiff/PATCH.md): without it, its sweep
//! waits for the outer graph's lock, which this thread holds.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::NodeId;
use burn::backend::Autodiff;
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::documents::Documents;
use crate::model::{forward_block, BlockRecompute, DecoderBlock};

static RECOMPUTED: AtomicU64 = AtomicU64::new(0);

/// Checkpoint backward steps run since the process started: how a test or a
/// user's loop tells that blocks were recomputed.
pub fn recomputed_blocks() -> u64 {
    RECOMPUTED.load(Ordering::Relaxed)
}

/// `f(module, x)` as a checkpoint, as `torch.utils.checkpoint` is used: on
/// `Autodiff` only `x` is kept (in host memory on `Offload`) and `f` runs
/// again in the backward, its graph kept only while its gradients are
/// formed; on other backends it is `f(module, x)`.
///
/// `f` must be deterministic (random draws replay only on `Offload`, whose
/// draws rewind) and must read no tracked tensor but `x` and `module`'s
/// parameters: a captured tracked tensor would join the outer graph, and the
/// forward panics where one reaches the output. Autodiff work stays on one
/// thread, as burn 0.21 requires (tracel-ai/burn#5573).
pub fn recompute<B, M, F, const D: usize>(module: &M, x: Tensor<B, D>, f: F) -> Tensor<B, D>
where
    B: BlockRecompute,
    M: Module<B> + 'static,
    F: Fn(&M, Tensor<B, D>) -> Tensor<B, D> + Send + Sync + 'static,
{
    B::recompute(module, x, f)
}

impl<X: BlockRecompute, C: CheckpointStrategy> BlockRecompute for Autodiff<X, C> {
    fn run_block<M: DecoderBlock<Self>>(
        block: &M,
        x: Tensor<Self, 3>,
        documents: Option<&Documents>,
    ) -> Tensor<Self, 3> {
        if !X::recompute_blocks() {
            return forward_block(block, x, documents);
        }
        let documents = documents.cloned();
        Self::recompute(block, x, move |block, x| {
            forward_block(block, x, documents.as_ref())
        })
    }

    fn recompute<M, F, const D: usize>(module: &M, x: Tensor<Self, D>, f: F) -> Tensor<Self, D>
    where
        M: Module<Self> + 'static,
        F: Fn(&M, Tensor<Self, D>) -> Tensor<Self, D> + Send + Sync + 'static,
    {
        checkpoint::<X, C, M, F, D>(module, x, f)
    }
}

/// Whether some float parameter of a module requires gradients. Reading
/// each one initialises a lazy parameter (burn's initializers) in place,
/// before the module is cloned: a clone of one not yet read draws values of
/// its own, so the forward, the recompute and the caller's module would each
/// see different weights.
struct Trains(bool);

impl<B: burn::tensor::backend::Backend> ModuleVisitor<B> for Trains {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _initialised = param.val();
        self.0 |= param.is_require_grad();
    }
}

/// Maps a module's float parameters to fresh leaves over the same values:
/// untracked, or (`tracked`) tracked where the parameter is, remembering
/// each tracked one's original node id beside its leaf.
struct Leaves<X: BlockRecompute, C: CheckpointStrategy> {
    tracked: bool,
    fresh: Vec<(NodeId, FloatTensor<Autodiff<X, C>>)>,
}

impl<X: BlockRecompute, C: CheckpointStrategy> ModuleMapper<Autodiff<X, C>> for Leaves<X, C> {
    fn map_float<const D: usize>(
        &mut self,
        param: Param<Tensor<Autodiff<X, C>, D>>,
    ) -> Param<Tensor<Autodiff<X, C>, D>> {
        let (id, tensor, mapper) = param.consume();
        let trains = tensor.is_require_grad();
        let original = tensor.into_primitive().tensor();
        let node = original.node.id;
        let leaf = Tensor::<Autodiff<X, C>, D>::from_inner(Tensor::from_primitive(
            TensorPrimitive::Float(original.primitive),
        ));
        let leaf = if self.tracked && trains {
            let leaf = leaf.require_grad();
            self.fresh
                .push((node, leaf.clone().into_primitive().tensor()));
            leaf
        } else {
            leaf
        };
        Param::from_mapped_value(id, leaf, mapper)
    }
}

/// What the checkpoint keeps: `f`, the module it runs on and where the
/// random draws stood when its forward began. `C` and `D` only name the
/// types `f` works on.
struct Recompute<M, F, C, const D: usize> {
    module: M,
    f: F,
    draws: Option<u64>,
    strategy: PhantomData<fn() -> C>,
}

impl<M: std::fmt::Debug, F, C, const D: usize> std::fmt::Debug for Recompute<M, F, C, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recompute")
            .field("module", &self.module)
            .finish_non_exhaustive()
    }
}

/// The checkpoint's input, stashed, and whether its gradient is wanted.
#[derive(Clone, Debug)]
struct Input<X: BlockRecompute> {
    stashed: FloatTensor<X>,
    tracked: bool,
}

/// The forward of [`recompute`] on `Autodiff<X, C>`.
fn checkpoint<X, C, M, F, const D: usize>(
    module: &M,
    x: Tensor<Autodiff<X, C>, D>,
    f: F,
) -> Tensor<Autodiff<X, C>, D>
where
    X: BlockRecompute,
    C: CheckpointStrategy,
    M: Module<Autodiff<X, C>> + 'static,
    F: Fn(&M, Tensor<Autodiff<X, C>, D>) -> Tensor<Autodiff<X, C>, D> + Send + Sync + 'static,
{
    let x = x.into_primitive().tensor();
    let input_tracked = x.is_tracked();
    let mut trains = Trains(false);
    module.visit(&mut trains);
    // Parameters to train behind an untracked input (a frozen embedding's
    // output): the operation needs a tracked parent to be on the tape at all.
    let x = if trains.0 && !input_tracked {
        x.require_grad()
    } else {
        x
    };
    let draws = X::draws();
    let untracked = module.clone().map(&mut Leaves::<X, C> {
        tracked: false,
        fresh: Vec::new(),
    });
    let y = f(&untracked, inner_leaf::<X, C, D>(x.primitive.clone()))
        .into_primitive()
        .tensor();
    assert!(
        !y.is_tracked(),
        "recompute: the function's output is tracked, so it read a tracked tensor other than \
         its input and its module's parameters (a captured one); pass it as the input or \
         through the module"
    );
    let op = Recompute::<M, F, C, D> {
        module: module.clone(),
        f,
        draws,
        strategy: PhantomData,
    };
    let out = match op.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let input = Input {
                stashed: X::stash(x.primitive),
                tracked: input_tracked,
            };
            prep.finish(input, y.primitive)
        }
        OpsKind::UnTracked(prep) => prep.finish(y.primitive),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// An untracked leaf of `Autodiff<X, C>` over an inner tensor.
fn inner_leaf<X: BlockRecompute, C: CheckpointStrategy, const D: usize>(
    t: FloatTensor<X>,
) -> Tensor<Autodiff<X, C>, D> {
    Tensor::from_inner(Tensor::from_primitive(TensorPrimitive::Float(t)))
}

impl<X, C, M, F, const D: usize> Backward<X, 1> for Recompute<M, F, C, D>
where
    X: BlockRecompute,
    C: CheckpointStrategy,
    M: Module<Autodiff<X, C>> + 'static,
    F: Fn(&M, Tensor<Autodiff<X, C>, D>) -> Tensor<Autodiff<X, C>, D> + Send + Sync + 'static,
{
    type State = Input<X>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<X>(&ops.node);
        let [parent] = ops.parents;
        let input = inner_leaf::<X, C, D>(X::unstash(ops.state.stashed));
        let wanted = parent.as_ref().filter(|_| ops.state.tracked);
        let input = if wanted.is_some() {
            input.require_grad()
        } else {
            input
        };
        let mut leaves = Leaves::<X, C> {
            tracked: true,
            fresh: Vec::new(),
        };
        let module = self.module.map(&mut leaves);
        let now = X::draws();
        if let Some(at) = self.draws {
            X::rewind_draws(at);
        }
        let y = (self.f)(&module, input.clone());
        if let Some(now) = now {
            X::rewind_draws(now);
        }
        // Nothing trained reached the output (trained parameters `f` does
        // not read, behind an untracked input): no gradient to form.
        if !y.clone().into_primitive().tensor().is_tracked() {
            RECOMPUTED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Seeded with ones, `y ⊙ dy` hands `y` exactly `dy`.
        let mut nested = (y * inner_leaf::<X, C, D>(dy)).backward();
        drop(module);
        if let Some(parent) = wanted {
            let gradient = input
                .grad_remove(&mut nested)
                .expect("the recomputed function's output depends on its input");
            grads.register::<X>(parent.id, gradient.into_primitive().tensor());
        }
        for (node, leaf) in leaves.fresh {
            // A parameter the function did not read has no gradient.
            if let Some(gradient) = leaf.grad_remove(&mut nested) {
                grads.register::<X>(node, X::release_gradient(gradient));
            }
        }
        RECOMPUTED.fetch_add(1, Ordering::Relaxed);
    }
}
