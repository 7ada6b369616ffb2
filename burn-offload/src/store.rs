//! `HostStore`: the model's parameters and optimizer state in host memory.
//!
//! Parameters are grouped: group 0 is the *stem* (everything outside the
//! blocks: embeddings, final norm, LM head), group `i + 1` is block `i`. Each
//! group owns one contiguous, page-aligned slab per kind of state (parameters,
//! Adam m, Adam v, and gradients unless the engine runs fused), laid out by a
//! [`ParamSlot`] table: parameter id → offset and shape. Page alignment is
//! what DMA engines and pinned registration want; contiguity lets one copy
//! move a whole block.

use std::alloc::{self, Layout};
use std::collections::{HashMap, HashSet};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{backend::Backend, Tensor};
use rayon::prelude::*;

const PAGE: usize = 4096;

/// A page-aligned, zero-initialised `f32` buffer.
pub struct Slab {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: a Slab exclusively owns its allocation, like a Box<[f32]>.
unsafe impl Send for Slab {}
unsafe impl Sync for Slab {}

impl Slab {
    pub fn zeros(len: usize) -> Self {
        if len == 0 {
            return Self {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len,
            };
        }
        let layout = Self::layout(len);
        // Not `alloc_zeroed`: with page alignment it zeroes on one thread,
        // which took tens of seconds for a multi-billion-parameter store.
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc(layout) } as *mut f32;
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        const CHUNK: usize = 1 << 18;
        let base = ptr as usize;
        (0..len.div_ceil(CHUNK)).into_par_iter().for_each(|i| {
            let start = i * CHUNK;
            // SAFETY: chunks are disjoint ranges inside the `len` f32 just allocated.
            unsafe {
                (base as *mut f32)
                    .add(start)
                    .write_bytes(0, CHUNK.min(len - start))
            };
        });
        Self { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len * std::mem::size_of::<f32>(), PAGE)
            .expect("slab size overflows")
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes this slab occupies.
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<f32>()
    }

    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: ptr is valid for len elements (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `zeros` with this exact layout.
            unsafe { alloc::dealloc(self.ptr as *mut u8, Self::layout(self.len)) }
        }
    }
}

/// Where one parameter lives inside its group's slabs. Slots are in the order
/// burn visits a module's parameters, which is how binding matches them.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSlot {
    /// Module path, e.g. `attn.q_proj.weight`.
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    pub len: usize,
}

impl ParamSlot {
    /// Its range in the group's slabs.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// The state of one group (the stem, or one block).
pub struct ParamGroup {
    pub slots: Vec<ParamSlot>,
    pub params: Slab,
    pub adam_m: Slab,
    pub adam_v: Slab,
    /// Accumulated gradients; `None` in fused mode, where each block's gradient
    /// is applied as soon as it arrives and never stored whole.
    pub grads: Option<Slab>,
}

/// A group's slabs without its layout: what the engine lends to its host
/// worker (see `crate::worker`) while the group is not in use.
pub struct GroupSlabs {
    pub params: Slab,
    pub adam_m: Slab,
    pub adam_v: Slab,
    pub grads: Option<Slab>,
}

impl ParamGroup {
    /// Number of parameters in the group.
    pub fn numel(&self) -> usize {
        self.params.len()
    }

    /// Takes the slabs out, leaving empty ones (the engine never reads a
    /// group while its slabs are lent; the allocations do not move, so
    /// page-locked ranges stay valid).
    pub(crate) fn lend(&mut self) -> GroupSlabs {
        let empty = || Slab::zeros(0);
        GroupSlabs {
            params: std::mem::replace(&mut self.params, empty()),
            adam_m: std::mem::replace(&mut self.adam_m, empty()),
            adam_v: std::mem::replace(&mut self.adam_v, empty()),
            grads: self.grads.as_mut().map(|g| std::mem::replace(g, empty())),
        }
    }

    /// Puts back what [`ParamGroup::lend`] took.
    pub(crate) fn restore(&mut self, slabs: GroupSlabs) {
        self.params = slabs.params;
        self.adam_m = slabs.adam_m;
        self.adam_v = slabs.adam_v;
        self.grads = slabs.grads;
    }

    pub fn param_bytes(&self) -> usize {
        self.params.bytes()
    }

    /// Parameter shapes in slot order.
    pub fn shapes(&self) -> Vec<Vec<usize>> {
        self.slots.iter().map(|s| s.shape.clone()).collect()
    }
}

/// Which state buffers the store keeps per parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLayout {
    /// Keep a full gradient buffer (16 bytes/param) or not (fused: 12 bytes/param).
    pub gradient_buffer: bool,
}

/// Why a model could not be put into (or taken out of) a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("parameter {id} appears in more than one group (blocks must not share weights)")]
    SharedParameter { id: ParamId },
    #[error("{group} of the model has parameter shapes {got:?}, but the store holds {want:?}")]
    ShapeMismatch {
        group: String,
        got: Vec<Vec<usize>>,
        want: Vec<Vec<usize>>,
    },
    #[error("model has {got} blocks but the store holds {want}")]
    BlockCount { got: usize, want: usize },
}

/// All parameters and optimizer state of a model, in host memory.
pub struct HostStore {
    pub groups: Vec<ParamGroup>,
    pub layout: StoreLayout,
}

/// One float parameter as visited: id, module path, shape and (optionally) values.
pub(crate) struct Visited {
    pub id: ParamId,
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// A parameter's values as f32 on the host (see [`read_into`]).
fn host_values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    let mut out = vec![0.0; tensor.shape().num_elements()];
    read_into(tensor, &mut out);
    out
}

/// Copies `tensor` (f32 values) into `out`. On CUDA the values come through a
/// page-locked buffer: `into_data` reads far slower, which dominated the
/// initialisation of multi-billion-parameter models.
fn read_into<B: Backend, const D: usize>(tensor: Tensor<B, D>, out: &mut [f32]) {
    #[cfg(feature = "cuda")]
    let tensor = match crate::cuda::try_read_into(tensor, out, false) {
        Ok(_) => return,
        Err(tensor) => tensor,
    };
    let data = tensor.into_data().convert::<f32>();
    out.copy_from_slice(data.as_slice::<f32>().expect("f32 data"));
}

/// Takes each parameter's value into its slot and leaves a placeholder.
struct Fill<'a> {
    groups: &'a mut [ParamGroup],
    slot_of: &'a HashMap<ParamId, (usize, usize)>,
}

impl<B: Backend> ModuleMapper<B> for Fill<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, _) = param.consume();
        let (g, k) = self.slot_of[&id];
        let group = &mut self.groups[g];
        let slot = &group.slots[k];
        let range = slot.range();
        let (shape, device) = (tensor.dims(), tensor.device());
        read_into(tensor, &mut group.params.as_mut_slice()[range]);
        Param::initialized(id, crate::pager::placeholder::<B, D>(shape, &device))
    }
}

/// Values of the float parameters not in `skip`, in visit order.
struct StemValues<'a> {
    skip: &'a HashSet<ParamId>,
    out: Vec<Vec<f32>>,
}

impl<B: Backend> ModuleVisitor<B> for StemValues<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !self.skip.contains(&param.id) {
            self.out.push(host_values(param.val()));
        }
    }
}

/// Collects every float parameter of a module in visit order, with its path;
/// reads values only when `read_values` (shape checks need none).
pub(crate) struct Collect {
    pub out: Vec<Visited>,
    path: Vec<String>,
    read_values: bool,
}

impl Collect {
    pub fn new(read_values: bool) -> Self {
        Self {
            out: Vec::new(),
            path: Vec::new(),
            read_values,
        }
    }
}

impl<B: Backend> ModuleVisitor<B> for Collect {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let (shape, values) = if self.read_values {
            let tensor = param.val();
            let shape = tensor.dims().to_vec();
            (shape, host_values(tensor))
        } else {
            // `lazy_shape`: reading a lazy parameter's shape must not draw it.
            (param.lazy_shape().dims::<D>().to_vec(), Vec::new())
        };
        self.out.push(Visited {
            id: param.id,
            name: self.path.join("."),
            shape,
            values,
        });
    }
}

impl HostStore {
    /// Builds a store from `model` (its stem: every parameter outside the
    /// blocks) and its `blocks`, copying the current parameter values. Groups
    /// are built one at a time, so at most one group's values are held twice.
    pub fn from_modules<B: Backend, M: Module<B>, K: Module<B>>(
        model: &M,
        blocks: &[K],
        layout: StoreLayout,
    ) -> Result<Self, StoreError> {
        let mut groups = Vec::with_capacity(blocks.len() + 1);
        let mut in_blocks = HashSet::new();
        for block in blocks {
            let mut collect = Collect::new(true);
            block.visit(&mut collect);
            for p in &collect.out {
                if !in_blocks.insert(p.id) {
                    return Err(StoreError::SharedParameter { id: p.id });
                }
            }
            groups.push(Self::group(collect.out, layout));
        }
        // The stem: read shapes first, then only the values outside the blocks.
        let mut stem = Collect::new(false);
        model.visit(&mut stem);
        let mut values = StemValues {
            skip: &in_blocks,
            out: Vec::new(),
        };
        model.visit(&mut values);
        let stem_params = stem
            .out
            .into_iter()
            .filter(|p| !in_blocks.contains(&p.id))
            .zip(values.out)
            .map(|(p, values)| Visited { values, ..p })
            .collect();
        groups.insert(0, Self::group(stem_params, layout));
        Ok(Self { groups, layout })
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
    pub fn take_from<B: Backend, M: Module<B>>(
        model: M,
        block_ids: &[Vec<ParamId>],
        layout: StoreLayout,
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
        let mut collect = Collect::new(false);
        model.visit(&mut collect);
        let mut members: Vec<Vec<Visited>> = (0..=block_ids.len()).map(|_| Vec::new()).collect();
        for p in collect.out {
            members[group_of.get(&p.id).copied().unwrap_or(0)].push(p);
        }
        let mut slot_of = HashMap::new();
        let mut groups = Vec::with_capacity(members.len());
        for (g, params) in members.into_iter().enumerate() {
            for (k, p) in params.iter().enumerate() {
                slot_of.insert(p.id, (g, k));
            }
            groups.push(Self::empty_group(&params, layout));
        }
        let mut fill = Fill {
            groups: &mut groups,
            slot_of: &slot_of,
        };
        let template = model.map(&mut fill);
        Ok((template, Self { groups, layout }))
    }

    /// A group with slabs for `params` (values not filled in).
    fn empty_group(params: &[Visited], layout: StoreLayout) -> ParamGroup {
        let mut slots = Vec::with_capacity(params.len());
        let mut offset = 0;
        for p in params {
            let len = p.shape.iter().product();
            slots.push(ParamSlot {
                name: p.name.clone(),
                shape: p.shape.clone(),
                offset,
                len,
            });
            offset += len;
        }
        ParamGroup {
            slots,
            params: Slab::zeros(offset),
            adam_m: Slab::zeros(offset),
            adam_v: Slab::zeros(offset),
            grads: layout.gradient_buffer.then(|| Slab::zeros(offset)),
        }
    }

    /// A group holding `params`' values (the slot table of [`Self::empty_group`]).
    fn group(params: Vec<Visited>, layout: StoreLayout) -> ParamGroup {
        let mut group = Self::empty_group(&params, layout);
        // Fill the slab in parallel: split it into the parameters' disjoint ranges.
        let mut rest = group.params.as_mut_slice();
        let mut targets = Vec::with_capacity(params.len());
        for p in &params {
            let (head, tail) = rest.split_at_mut(p.values.len());
            targets.push((head, &p.values));
            rest = tail;
        }
        targets
            .into_par_iter()
            .for_each(|(dst, src)| dst.copy_from_slice(src));
        group
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

    pub fn num_params(&self) -> usize {
        self.groups.iter().map(ParamGroup::numel).sum()
    }

    /// Host bytes held per parameter by the store (16 with a gradient buffer, 12 fused).
    pub fn bytes_per_param(&self) -> usize {
        if self.layout.gradient_buffer {
            16
        } else {
            12
        }
    }

    /// Host bytes held by all slabs.
    pub fn host_bytes(&self) -> usize {
        self.groups
            .iter()
            .map(|g| {
                g.params.bytes()
                    + g.adam_m.bytes()
                    + g.adam_v.bytes()
                    + g.grads.as_ref().map_or(0, Slab::bytes)
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
