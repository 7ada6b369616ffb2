//! One parameter group's state: its slot table and slabs.

use crate::host::slab::Slab;

/// Where one parameter lives inside its group's slabs. Slots are in the order
/// burn visits a module's parameters, which is how binding matches them.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSlot {
    /// Module path, e.g. `attn.q_proj.weight`.
    pub name: String,
    /// The parameter's shape.
    pub shape: Vec<usize>,
    /// Its first element in the group's slabs.
    pub offset: usize,
    /// Its number of elements.
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
    /// The parameters' places, in visit order.
    pub slots: Vec<ParamSlot>,
    /// Parameter values.
    pub params: Slab,
    /// First moment (SGD: momentum).
    pub adam_m: Slab,
    /// Second moment.
    pub adam_v: Slab,
    /// Accumulated gradients; `None` in fused mode, where each block's gradient
    /// is applied as soon as it arrives and never stored whole.
    pub grads: Option<Slab>,
}

/// A group's slabs without its layout: what the engine lends to its host
/// worker (see `crate::host::worker`) while the group is not in use.
pub struct GroupSlabs {
    /// Parameter values.
    pub params: Slab,
    /// First moment.
    pub adam_m: Slab,
    /// Second moment.
    pub adam_v: Slab,
    /// Accumulated gradients (none in fused mode).
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

    /// Bytes of the parameter values.
    pub fn param_bytes(&self) -> usize {
        self.params.bytes()
    }

    /// Parameter shapes in slot order.
    pub fn shapes(&self) -> Vec<Vec<usize>> {
        self.slots.iter().map(|s| s.shape.clone()).collect()
    }
}
