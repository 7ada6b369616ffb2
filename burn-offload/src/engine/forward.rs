//! Phase 1, the forward: the blocks streamed through the device with no
//! graph, each bound just before it runs and dropped after, their inputs
//! kept for the backward (and sampling's forward, which keeps nothing).

use std::collections::HashSet;

use burn::module::{AutodiffModule, HasAutodiffModule, Module, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor};

use super::{embed_tokens, StreamedModel};
use super::{BlockAd, Engine, EngineError, AD};
use crate::engine::config::BatchError;
use crate::host::{throttle, trace};
use crate::model::forward_block;
use crate::ops::attention::{capture, AttentionMemo};
use crate::precision::{cast_leaves, cast_to};
use crate::transfer::Stash;
use crate::{BlockModel, Documents};

/// A block whose forward kept its graph: the bound block, its input
/// (requiring a gradient) and its output, for a backward with no recompute.
pub(super) type KeptGraph<B, M> = (BlockAd<B, M>, Tensor<AD<B>, 3>, Tensor<AD<B>, 3>);

/// A block bound for the forward: graph-free, or under `Autodiff` when its
/// graph is kept for the backward.
pub(super) enum ForwardBlock<P, A> {
    Plain(P),
    Graph(A),
}

/// What the forward leaves for the backward: a checkpoint per recomputed
/// block, then the kept graphs of the last blocks.
pub(super) struct ForwardState<B: Backend, M: BlockModel<B>>
where
    M::Block: HasAutodiffModule<AD<B>>,
{
    pub checkpoints: Vec<Stash<B>>,
    /// The last checkpointed blocks' attention outputs, as many as
    /// [`EngineConfig::kept_attention`](super::EngineConfig::kept_attention).
    pub attention: Vec<AttentionMemo>,
    pub graphs: Vec<KeptGraph<B, M>>,
}

impl<B: Backend, M: StreamedModel<B>> Engine<B, M> {
    /// The first block whose graph the forward keeps (`num_blocks` when none).
    pub(super) fn first_kept(&self, num_blocks: usize) -> usize {
        num_blocks - self.config.kept_graphs.min(num_blocks)
    }

    /// Binds block `i` on `lane` for the forward: under `Autodiff` from
    /// `first_kept` on.
    pub(super) fn bind_forward(
        &mut self,
        blocks: &[M::Block],
        i: usize,
        first_kept: usize,
        lane: usize,
    ) -> ForwardBlock<M::Block, BlockAd<B, M>> {
        // Trace marks for the first blocks, whose binds follow the step
        // boundary: the wait for the update, then the copies' issue.
        let marked = i < 2 && lane == 0 && trace::enabled();
        // The block's own update first: it would wait for the copy's window.
        self.settle(i + 1);
        if marked {
            self.mark(format_args!("block {i} updated"));
        }
        // The copy's window: the host optimizer yields host memory bandwidth
        // to it until it lands (see `host::throttle`).
        let copying = (self.worker.is_some() && self.config.hold_updates_for_copies)
            .then(throttle::copy_started);
        let bound = if i >= first_kept {
            ForwardBlock::Graph(self.bind_block_ad(blocks, i, lane))
        } else {
            ForwardBlock::Plain(self.bind_block(blocks, i, lane))
        };
        if let Some(landed) = copying {
            let lane = &self.lanes[lane];
            lane.pager.after_uploads::<B>(&lane.device, landed);
        }
        if marked {
            self.mark(format_args!("block {i} copies issued"));
        }
        bound
    }

    /// Streams the blocks forward on the first `inputs.len()` lanes, lane
    /// `d` on `inputs[d]` (on its device), in lockstep: the stem embeds,
    /// then each block runs while the next one's weights are copied. In
    /// training (`train`) every recomputed block's input is stashed for the
    /// backward, and the last [`EngineConfig::kept_graphs`] blocks run under
    /// `Autodiff` and keep their graphs (and weights) until the backward;
    /// otherwise no graph. Lane `d`'s rows hold the packed `documents[d]`
    /// where given. Returns each lane's last hidden states and state.
    #[allow(clippy::type_complexity)]
    pub(super) fn stream_forward(
        &mut self,
        blocks: &[M::Block],
        inputs: &[Tensor<B, 2, Int>],
        documents: &[Option<&Documents>],
        train: bool,
    ) -> Result<Vec<(Tensor<B, 3>, ForwardState<B, M>)>, EngineError> {
        let num_blocks = blocks.len();
        let lanes = inputs.len();
        let first_kept = if train {
            self.first_kept(num_blocks)
        } else {
            num_blocks
        };
        let embedded = match self.embedding_slot {
            Some(slot) => self.embed_on_host(slot, inputs)?,
            None => (0..lanes)
                .map(|d| {
                    let stem = self.bind_stem::<B, M>(self.template.clone(), false, true, d);
                    let lane = &mut self.lanes[d];
                    lane.pager.ready::<B>(&lane.device);
                    let embedded = embed_tokens(&stem, inputs[d].clone(), documents[d]);
                    drop(stem);
                    lane.pager.evict(0);
                    embedded
                })
                .collect(),
        };
        let dtype = self.config.compute.dtype();
        let mut x: Vec<Tensor<B, 3>> = embedded.into_iter().map(|e| cast_to(e, dtype)).collect();
        self.mark("embedded");
        let mut state: Vec<ForwardState<B, M>> = (0..lanes)
            .map(|_| ForwardState {
                checkpoints: Vec::with_capacity(first_kept),
                attention: Vec::new(),
                graphs: Vec::with_capacity(num_blocks - first_kept),
            })
            .collect();
        let mut next: Vec<Option<_>> = (0..lanes)
            .map(|d| (num_blocks > 0).then(|| self.bind_forward(blocks, 0, first_kept, d)))
            .collect();
        for i in 0..num_blocks {
            // Block i+1's copy runs behind block i's compute: bound before
            // block i's kernels are submitted, unless the host worker is still
            // updating it (after the step boundary), where waiting for it
            // would keep block i's kernels from a device with nothing to do.
            let bind_after = i + 1 < num_blocks && self.update_running(i + 2);
            for d in 0..lanes {
                let block = next[d].take().expect("block bound ahead");
                // Block i's weights have landed.
                let lane = &mut self.lanes[d];
                lane.pager.ready::<B>(&lane.device);
                let block = match block {
                    ForwardBlock::Plain(block) => ForwardBlock::Plain(self.landed(block)),
                    ForwardBlock::Graph(block) => ForwardBlock::Graph(self.landed(block)),
                };
                if i < 2 && d == 0 {
                    self.mark(format_args!("block {i} landed"));
                }
                if i + 1 < num_blocks && !bind_after {
                    next[d] = Some(self.bind_forward(blocks, i + 1, first_kept, d));
                }
                let input = x[d].clone();
                let want = input.dims();
                let output = match block {
                    ForwardBlock::Plain(block) => {
                        if train {
                            // The last recomputed blocks' stay on the device
                            // (the backward takes them first).
                            let on_device =
                                i.saturating_add(self.config.device_checkpoints) >= first_kept;
                            let stash = self.lanes[d].pager.stash(input.clone(), on_device);
                            state[d].checkpoints.push(stash);
                        }
                        // The last recomputed blocks keep theirs: the
                        // backward recomputes them first, taking these last in, first out.
                        let keep = i.saturating_add(self.config.kept_attention) >= first_kept;
                        let output = if train && keep {
                            let (output, kept) =
                                capture(|| forward_block(&block, input, documents[d]));
                            state[d].attention.push(kept);
                            output
                        } else {
                            forward_block(&block, input, documents[d])
                        };
                        drop(block);
                        self.lanes[d].pager.evict(i + 1);
                        output
                    }
                    ForwardBlock::Graph(block) => {
                        // Bound until its backward, which reads this graph.
                        let input = Tensor::<AD<B>, 3>::from_inner(input).require_grad();
                        let output = forward_block(&block, input.clone(), documents[d]);
                        let inner = output.clone().inner();
                        state[d].graphs.push((block, input, output));
                        inner
                    }
                };
                if bind_after {
                    let lane = &self.lanes[d];
                    lane.pager.flush::<B>(&lane.device);
                    next[d] = Some(self.bind_forward(blocks, i + 1, first_kept, d));
                }
                if output.dims() != want {
                    // Later blocks and the recompute would read a mis-shaped checkpoint.
                    drop(next);
                    drop(state);
                    for lane in &mut self.lanes {
                        for g in 1..=num_blocks {
                            lane.pager.evict(g);
                        }
                    }
                    return Err(EngineError::Checkpoint {
                        block: i,
                        got: output.dims().to_vec(),
                        want: want.to_vec(),
                    });
                }
                x[d] = output;
            }
        }
        Ok(x.into_iter().zip(state).collect())
    }

    /// A module bound in the compute precision, once its copies have landed
    /// ([`crate::transfer::Pager::ready`]): with
    /// [`EngineConfig::cast_on_device`](super::EngineConfig::cast_on_device)
    /// its f32 weights are cast on the device now, as new leaves (so its
    /// gradients come back in the compute precision, as from a bf16 bind).
    pub(super) fn landed<X: Backend, T: Module<X>>(&self, module: T) -> T {
        self.cast_landed(module, &HashSet::new())
    }

    /// [`Self::landed`] for a bound stem: the blocks in the whole template
    /// are placeholders and stay as they are.
    pub(super) fn landed_stem<X: Backend, T: Module<X>>(&self, stem: T) -> T {
        self.cast_landed(stem, &self.block_ids)
    }

    fn cast_landed<X: Backend, T: Module<X>>(&self, module: T, skip: &HashSet<ParamId>) -> T {
        if self.config.cast_on_device {
            cast_leaves(module, self.config.compute.dtype(), skip)
        } else {
            module
        }
    }

    /// Binds block `i` on `lane` (its weights paged in) for graph-free forward.
    pub(super) fn bind_block(&mut self, blocks: &[M::Block], i: usize, lane: usize) -> M::Block {
        self.bind_group::<B, _>(blocks[i].clone(), i + 1, false, false, lane)
    }

    /// Binds block `i` on `lane` under `Autodiff`, its parameters requiring gradients.
    pub(super) fn bind_block_ad(
        &mut self,
        blocks: &[M::Block],
        i: usize,
        lane: usize,
    ) -> BlockAd<B, M> {
        let template = BlockAd::<B, M>::from_inner(blocks[i].clone());
        self.bind_group::<AD<B>, _>(template, i + 1, true, false, lane)
    }

    /// Binds the stem (embeddings, final norm, head) into the whole template
    /// on `lane`, in the compute precision or, with `f32`, from the f32
    /// master weights. The embedding phases bind it in f32: a bf16 embedding
    /// gradient would sum every occurrence of a token in bf16 (autocast keeps
    /// embeddings f32 too); its output is cast to the compute precision.
    pub(super) fn bind_stem<X: Backend, T: Module<X>>(
        &mut self,
        template: T,
        require_grad: bool,
        f32: bool,
        lane: usize,
    ) -> T
    where
        X::Device: From<B::Device>,
    {
        self.bind_group(template, 0, require_grad, f32, lane)
    }

    /// Binds group `g` into `template` on `lane` once its deferred update is
    /// applied, from its bf16 copy in bf16 mode unless `f32`.
    pub(super) fn bind_group<X: Backend, T: Module<X>>(
        &mut self,
        template: T,
        g: usize,
        require_grad: bool,
        f32: bool,
        lane: usize,
    ) -> T
    where
        X::Device: From<B::Device>,
    {
        self.settle(g);
        if !f32 {
            self.refresh_bf16(g);
        }
        let bf16 = self.bf16.as_ref().filter(|_| !f32).map(|c| c.values(g));
        // The stem is bound into the whole model, whose blocks it skips.
        let no_skip = HashSet::new();
        let skip = if g == 0 { &self.block_ids } else { &no_skip };
        let lane = &mut self.lanes[lane];
        let device = X::Device::from(lane.device.clone());
        lane.pager.bind(
            template,
            g,
            &self.store.groups[g],
            bf16,
            skip,
            require_grad,
            &device,
        )
    }

    /// Logits at the last position of each sequence, `[batch, vocab]`, with
    /// the blocks streamed as in training's forward (no graph), on the first
    /// device: sampling never needs the whole model on the device.
    pub fn last_logits(&mut self, inputs: &Tensor<B, 2, Int>) -> Result<Tensor<B, 2>, EngineError> {
        not_empty(inputs)?;
        let blocks = self.template.blocks().to_vec();
        let inputs = [crate::transfer::on_device(
            inputs.clone(),
            &self.lanes[0].device,
        )];
        let (x, _) = self
            .stream_forward(&blocks, &inputs, &[None], false)?
            .pop()
            .expect("one lane");
        Ok(self.last_head(x))
    }

    /// [`Engine::last_logits`] with block `i` run as `run(i, block, x)`
    /// instead of its forward (for generation: a forward that keeps its
    /// keys and values on the device), and the tokens embedded by `embed`
    /// where the model's embedding is not a table lookup the engine makes
    /// on the host (learned positions counted from an offset). The blocks
    /// stream as in [`Engine::last_logits`], each bound once, the next one's
    /// copy behind this one's compute.
    pub fn last_logits_with(
        &mut self,
        inputs: &Tensor<B, 2, Int>,
        embed: impl FnOnce(&M, Tensor<B, 2, Int>) -> Tensor<B, 3>,
        mut run: impl FnMut(usize, &M::Block, Tensor<B, 3>) -> Tensor<B, 3>,
    ) -> Result<Tensor<B, 2>, EngineError> {
        not_empty(inputs)?;
        let inputs = crate::transfer::on_device(inputs.clone(), &self.lanes[0].device);
        let x = match self.embedding_slot {
            Some(slot) => self
                .embed_on_host(slot, std::slice::from_ref(&inputs))?
                .pop()
                .expect("one lane"),
            None => {
                let stem = self.bind_stem::<B, M>(self.template.clone(), false, true, 0);
                let lane = &mut self.lanes[0];
                lane.pager.ready::<B>(&lane.device);
                let x = embed(&stem, inputs);
                drop(stem);
                self.lanes[0].pager.evict(0);
                x
            }
        };
        let mut x = cast_to(x, self.config.compute.dtype());
        let blocks = self.template.blocks().to_vec();
        let mut next = (!blocks.is_empty()).then(|| self.bind_block(&blocks, 0, 0));
        for i in 0..blocks.len() {
            let block = next.take().expect("block bound ahead");
            let lane = &mut self.lanes[0];
            lane.pager.ready::<B>(&lane.device);
            let block = self.landed(block);
            if i + 1 < blocks.len() {
                next = Some(self.bind_block(&blocks, i + 1, 0));
            }
            x = run(i, &block, x);
            drop(block);
            self.lanes[0].pager.evict(i + 1);
        }
        Ok(self.last_head(x))
    }

    /// The head's logits `[batch, vocab]` in f32 at the last position of the
    /// last block's output `x`, the stem bound for it.
    fn last_head(&mut self, x: Tensor<B, 3>) -> Tensor<B, 2> {
        let [batch, seq, _] = x.dims();
        let logits = self.with_stem(|stem| stem.head(x.narrow(1, seq - 1, 1)));
        let vocab = logits.dims()[2];
        cast_to(logits, DType::F32).reshape([batch, vocab])
    }

    /// `f` of the stem bound on the first device without a graph, dropped
    /// after (the head of sampling and of evaluation).
    pub(super) fn with_stem<R>(&mut self, f: impl FnOnce(&M) -> R) -> R {
        let stem = self.bind_stem::<B, M>(self.template.clone(), false, false, 0);
        let lane = &mut self.lanes[0];
        lane.pager.ready::<B>(&lane.device);
        let stem = self.landed_stem(stem);
        let out = f(&stem);
        drop(stem);
        self.lanes[0].pager.evict(0);
        out
    }
}

/// Refuses an input of no tokens: `[batch, seq]` with a zero.
pub(super) fn not_empty<B: Backend>(inputs: &Tensor<B, 2, Int>) -> Result<[usize; 2], EngineError> {
    let [batch, seq] = inputs.dims();
    if batch == 0 || seq == 0 {
        return Err(BatchError::Empty {
            index: 0,
            shape: [batch, seq],
        }
        .into());
    }
    Ok([batch, seq])
}
