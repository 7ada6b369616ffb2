//! `HostStore`: the model's parameters and optimizer state in host memory.
//!
//! Parameters are grouped: group 0 is the *stem* (everything outside the
//! blocks: embeddings, final norm, LM head), group `i + 1` is block `i`. Each
//! group owns one contiguous, page-aligned slab per kind of state (parameters,
//! Adam m, Adam v, and gradients unless the engine runs fused), laid out by a
//! [`ParamSlot`] table: parameter id → offset and shape. Page alignment is
//! what DMA engines and pinned registration want; contiguity lets one copy
//! move a whole block.

use std::collections::HashMap;
use std::marker::PhantomData;

use burn::module::{Module, ParamId};
use burn::tensor::backend::Backend;

use super::template::{param_ids, Collect, Fill, HostValues, NoHostValues, ReadBack, Visited};
use super::{Frozen, FrozenParams, GradBuffer, Member, Moments, ParamGroup, ParamSlot};
use crate::host::slab::Slab;

/// Draws every lazily initialised parameter of a module.
struct Materialize;

impl<B: Backend> burn::module::ModuleVisitor<B> for Materialize {
    fn visit_float<const D: usize>(
        &mut self,
        param: &burn::module::Param<burn::tensor::Tensor<B, D>>,
    ) {
        let _ = param.val();
    }
}

/// Reads values back through `into_data` (any backend).
pub struct ReadData;

impl ReadBack for ReadData {}

/// Which state buffers the store keeps per parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLayout {
    /// Keep a full gradient buffer (16 bytes/param) or not (fused: 12 bytes/param).
    pub gradient_buffer: bool,
    /// The blocks' gradient buffers hold bf16 (14 bytes/param for the
    /// blocks); the stem's stays f32.
    pub bf16_block_gradients: bool,
    /// The optimizer's moments are 8-bit blockwise (about 2 bytes/param for
    /// both instead of 8).
    pub eight_bit_moments: bool,
}

impl StoreLayout {
    /// An f32 gradient buffer (`true`) or none.
    pub fn f32_gradients(gradient_buffer: bool) -> Self {
        Self {
            gradient_buffer,
            bf16_block_gradients: false,
            eight_bit_moments: false,
        }
    }
}

/// Why a model could not be put into (or taken out of) a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Two blocks hold the same parameter.
    #[error("parameter {id} appears in more than one group (blocks must not share weights)")]
    SharedParameter {
        /// The shared parameter.
        id: ParamId,
    },
    /// A group's parameter shapes differ from the store's.
    #[error("{group} of the model has parameter shapes {got:?}, but the store holds {want:?}")]
    ShapeMismatch {
        /// `the stem` or `block i`.
        group: String,
        /// The model's shapes.
        got: Vec<Vec<usize>>,
        /// The store's.
        want: Vec<Vec<usize>>,
    },
    /// The model's depth differs from the store's.
    #[error("model has {got} blocks but the store holds {want}")]
    BlockCount {
        /// The model's blocks.
        got: usize,
        /// The store's.
        want: usize,
    },
}

/// All parameters and optimizer state of a model, in host memory.
pub struct HostStore {
    /// The stem (group 0), then one group per block.
    pub groups: Vec<ParamGroup>,
    /// Which state buffers each group keeps.
    pub layout: StoreLayout,
}

impl HostStore {
    /// Builds a store from `model` (its stem: every parameter outside the
    /// blocks) and its `blocks`, copying the current parameter values
    /// (through `into_data`; the engine's own constructor reads through its
    /// device's copy machinery).
    pub fn from_modules<B: Backend, M: Module<B>, K: Module<B>>(
        model: &M,
        blocks: &[K],
        layout: StoreLayout,
    ) -> Result<Self, StoreError> {
        let block_ids = param_ids(blocks);
        // A clone shares the tensors, once drawn (a lazy parameter's clone
        // would draw its own values); only the clone's parameters are replaced.
        model.visit(&mut Materialize);
        let (_, store) = Self::take_from::<B, M, ReadData>(
            model.clone(),
            &block_ids,
            layout,
            None,
            &NoHostValues,
        )?;
        Ok(store)
    }

    /// Moves `model`'s parameters into a new store and returns the model with
    /// every parameter replaced by a placeholder (the engine's template).
    /// `block_ids` lists each block's parameter ids (group `i + 1`); every
    /// other parameter goes to the stem.
    ///
    /// Parameters are taken one at a time, in visit order: a lazily
    /// initialised parameter is drawn on its device, read straight into its
    /// slab and dropped before the next one is drawn. So building the store of
    /// a model far larger than GPU memory needs one tensor's worth of device
    /// memory and no second host copy, and the draws happen in the same order
    /// as a full `visit` would make them (the same seed gives the same weights).
    ///
    /// The parameters `frozen` names are held in its format, with no
    /// gradient or optimizer state (a LoRA fine-tune's base). Those `values`
    /// holds are read from it and never drawn.
    pub fn take_from<B: Backend, M: Module<B>, R: ReadBack>(
        model: M,
        block_ids: &[Vec<ParamId>],
        layout: StoreLayout,
        frozen: Option<&Frozen>,
        values: &dyn HostValues,
    ) -> Result<(M, Self), StoreError> {
        let mut group_of = HashMap::new();
        for (i, ids) in block_ids.iter().enumerate() {
            for id in ids {
                if group_of.insert(*id, i + 1).is_some() {
                    return Err(StoreError::SharedParameter { id: *id });
                }
            }
        }
        // Shapes and names first (nothing is drawn), then the slabs.
        let mut collect = Collect::default();
        model.visit(&mut collect);
        let mut members: Vec<Vec<Visited>> = (0..=block_ids.len()).map(|_| Vec::new()).collect();
        for p in collect.out {
            members[group_of.get(&p.id).copied().unwrap_or(0)].push(p);
        }
        let mut slot_of = HashMap::new();
        let mut groups = Vec::with_capacity(members.len());
        for (g, params) in members.into_iter().enumerate() {
            let group = Self::empty_group(&params, layout, g > 0, frozen);
            for (p, member) in params.iter().zip(&group.members) {
                slot_of.insert(p.id, (g, *member));
            }
            groups.push(group);
        }
        let mut fill = Fill::<R> {
            groups: &mut groups,
            slot_of: &slot_of,
            values,
            read: PhantomData,
        };
        let template = model.map(&mut fill);
        Ok((template, Self { groups, layout }))
    }

    /// A group with slabs for `params` (values not filled in), those in
    /// `frozen` laid out in its format.
    fn empty_group(
        params: &[Visited],
        layout: StoreLayout,
        block: bool,
        frozen: Option<&Frozen>,
    ) -> ParamGroup {
        let mut slots = Vec::with_capacity(params.len());
        let mut members = Vec::with_capacity(params.len());
        let mut frozen_params = Vec::new();
        let mut offset = 0;
        for p in params {
            if frozen.is_some_and(|f| f.ids.contains(&p.id)) {
                members.push(Member::Frozen(frozen_params.len()));
                frozen_params.push((p.name.clone(), p.shape.clone()));
                continue;
            }
            let len = p.shape.iter().product();
            members.push(Member::Trained(slots.len()));
            slots.push(ParamSlot {
                name: p.name.clone(),
                shape: p.shape.clone(),
                offset,
                len,
            });
            offset += len;
        }
        let frozen = match frozen {
            Some(f) if !frozen_params.is_empty() => {
                FrozenParams::layout(&frozen_params, f.dtype, block)
            }
            _ => FrozenParams::default(),
        };
        ParamGroup {
            slots,
            members,
            frozen,
            params: Slab::zeros(offset),
            moments: Moments::zeros(offset, layout.eight_bit_moments),
            grads: layout
                .gradient_buffer
                .then(|| GradBuffer::zeros(offset, block && layout.bf16_block_gradients)),
        }
    }

    /// `(name, shape)` of every parameter, per group: what a checkpoint records.
    pub fn slot_table(&self) -> Vec<Vec<(String, Vec<usize>)>> {
        self.groups
            .iter()
            .map(|g| {
                g.slots
                    .iter()
                    .map(|s| (s.name.clone(), s.shape.clone()))
                    .collect()
            })
            .collect()
    }

    /// Number of blocks (groups after the stem).
    pub fn num_blocks(&self) -> usize {
        self.groups.len() - 1
    }

    /// Number of trained parameters in every group.
    pub fn num_params(&self) -> usize {
        self.groups.iter().map(ParamGroup::numel).sum()
    }

    /// Number of frozen parameters in every group.
    pub fn num_frozen(&self) -> usize {
        self.groups.iter().map(|g| g.frozen.numel()).sum()
    }

    /// Host bytes held per parameter by the store: 12 for the weights and
    /// both moments (about 6 with 8-bit moments), and the gradient buffer's (4, 2 in bf16, none fused), on
    /// average over the groups; frozen parameters count with what their
    /// format holds.
    pub fn bytes_per_param(&self) -> f64 {
        self.host_bytes() as f64 / (self.num_params() + self.num_frozen()).max(1) as f64
    }

    /// Host bytes held by all slabs.
    pub fn host_bytes(&self) -> usize {
        self.groups
            .iter()
            .map(|g| {
                g.params.bytes()
                    + g.moments.bytes()
                    + g.grads.as_ref().map_or(0, GradBuffer::bytes)
                    + g.frozen.bytes()
            })
            .sum()
    }

    /// Checks that a module has exactly the parameter shapes the store holds
    /// for `group` (a model and a store that disagree would bind garbage).
    pub fn check_group(&self, group: usize, shapes: Vec<Vec<usize>>) -> Result<(), StoreError> {
        let want = self.groups[group].shapes();
        if shapes != want {
            let group = if group == 0 {
                "the stem".to_string()
            } else {
                format!("block {}", group - 1)
            };
            return Err(StoreError::ShapeMismatch {
                group,
                got: shapes,
                want,
            });
        }
        Ok(())
    }
}
