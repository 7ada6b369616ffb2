//! One parameter group's state: its slot table and slabs.

use super::{FrozenParams, Moments};
use crate::host::optim::GradSlice;
use crate::host::slab::{Bf16Slab, Slab};

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

/// One parameter of a group, in the order burn visits the group's module:
/// trained (its index in [`ParamGroup::slots`]) or frozen (its index in the
/// [`ParamGroup::frozen`] slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Member {
    /// Trained: has a gradient and optimizer state.
    Trained(usize),
    /// Frozen: neither.
    Frozen(usize),
}

/// The state of one group (the stem, or one block).
pub struct ParamGroup {
    /// The trained parameters' places, in visit order.
    pub slots: Vec<ParamSlot>,
    /// Every parameter in visit order, trained or frozen.
    pub members: Vec<Member>,
    /// The frozen parameters (none unless the store was built with some).
    pub frozen: FrozenParams,
    /// Parameter values.
    pub params: Slab,
    /// The optimizer's moments.
    pub moments: Moments,
    /// Accumulated gradients; `None` in fused mode, where each block's gradient
    /// is applied as soon as it arrives and never stored whole.
    pub grads: Option<GradBuffer>,
}

/// A group's gradient buffer: f32, or bf16 where a block's gradient arrives
/// in bf16 and is not accumulated (kept as it arrived: nothing is lost, and
/// it costs half the host memory).
pub enum GradBuffer {
    /// f32 values.
    F32(Slab),
    /// bf16 values.
    Bf16(Bf16Slab),
}

impl GradBuffer {
    /// `len` zeros, in bf16 with `bf16`.
    pub fn zeros(len: usize, bf16: bool) -> Self {
        if bf16 {
            GradBuffer::Bf16(Bf16Slab::zeros(len))
        } else {
            GradBuffer::F32(Slab::zeros(len))
        }
    }

    /// An empty buffer of the same kind (what a lent group keeps).
    fn empty_like(&self) -> Self {
        Self::zeros(0, matches!(self, GradBuffer::Bf16(_)))
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            GradBuffer::F32(s) => s.len(),
            GradBuffer::Bf16(s) => s.len(),
        }
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes it occupies.
    pub fn bytes(&self) -> usize {
        match self {
            GradBuffer::F32(s) => s.bytes(),
            GradBuffer::Bf16(s) => s.bytes(),
        }
    }

    /// The values.
    pub fn values(&self) -> GradSlice<'_> {
        match self {
            GradBuffer::F32(s) => GradSlice::F32(s.as_slice()),
            GradBuffer::Bf16(s) => GradSlice::Bf16(s.as_slice()),
        }
    }

    /// The values of an f32 buffer, to write (the stem's always is).
    pub fn f32_mut(&mut self) -> Option<&mut [f32]> {
        match self {
            GradBuffer::F32(s) => Some(s.as_mut_slice()),
            GradBuffer::Bf16(_) => None,
        }
    }
}

/// A group's slabs without its layout: what the engine lends to its host
/// worker (see `crate::host::worker`) while the group is not in use.
pub struct GroupSlabs {
    /// Parameter values.
    pub params: Slab,
    /// The optimizer's moments.
    pub moments: Moments,
    /// Accumulated gradients (none in fused mode).
    pub grads: Option<GradBuffer>,
}

impl ParamGroup {
    /// Number of trained parameters in the group.
    pub fn numel(&self) -> usize {
        self.params.len()
    }

    /// The `i`-th parameter visited, trained or frozen.
    pub fn member(&self, i: usize) -> Member {
        self.members[i]
    }

    /// The slot of the `i`-th parameter visited where it is trained.
    pub fn trained_slot(&self, i: usize) -> Option<&ParamSlot> {
        match self.members[i] {
            Member::Trained(k) => Some(&self.slots[k]),
            Member::Frozen(_) => None,
        }
    }

    /// Takes the slabs out, leaving empty ones (the engine never reads a
    /// group while its slabs are lent; the allocations do not move, so
    /// page-locked ranges stay valid).
    pub(crate) fn lend(&mut self) -> GroupSlabs {
        let empty = || Slab::zeros(0);
        GroupSlabs {
            params: std::mem::replace(&mut self.params, empty()),
            moments: {
                let empty = self.moments.empty_like();
                std::mem::replace(&mut self.moments, empty)
            },
            grads: self.grads.as_mut().map(|g| {
                let empty = g.empty_like();
                std::mem::replace(g, empty)
            }),
        }
    }

    /// Puts back what [`ParamGroup::lend`] took.
    pub(crate) fn restore(&mut self, slabs: GroupSlabs) {
        self.params = slabs.params;
        self.moments = slabs.moments;
        self.grads = slabs.grads;
    }

    /// Bytes of the parameter values.
    pub fn param_bytes(&self) -> usize {
        self.params.bytes()
    }

    /// Every parameter's shape (trained or frozen) in visit order.
    pub fn shapes(&self) -> Vec<Vec<usize>> {
        self.members
            .iter()
            .map(|m| match *m {
                Member::Trained(k) => self.slots[k].shape.clone(),
                Member::Frozen(k) => self.frozen.slots[k].shape.clone(),
            })
            .collect()
    }
}
