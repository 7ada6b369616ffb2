//! The compute-precision (bf16) copies of the parameters.

use burn::tensor::bf16;

use super::HostStore;
use crate::host::bf16::round_into_par;
use crate::host::slab::Bf16Slab;

/// bf16 copies of every group's parameters: what the pager uploads in bf16
/// mode with the full host layout (half the bytes of f32, and no cast on the
/// device). A copy is refreshed right after its group's update; anything
/// else that writes parameters (loaders, surgery) marks every copy stale,
/// and a stale copy is refreshed before its group is bound. Page-aligned
/// like the store's slabs, so they can be pinned.
pub struct Bf16Weights {
    slabs: Vec<Bf16Slab>,
    lens: Vec<usize>,
    stale: Vec<bool>,
}

impl Bf16Weights {
    /// Stale copies sized for `store`'s groups (2 host bytes per parameter).
    pub fn new(store: &HostStore) -> Self {
        let lens: Vec<usize> = store.groups.iter().map(|g| g.numel()).collect();
        Self {
            slabs: lens.iter().map(|&n| Bf16Slab::zeros(n)).collect(),
            stale: vec![true; lens.len()],
            lens,
        }
    }

    /// Group `g`'s bf16 values (refreshed or not).
    pub fn values(&self, g: usize) -> &[bf16] {
        self.slabs[g].as_slice()
    }

    /// The bytes of every copy, for pinning.
    pub fn slabs(&self) -> impl Iterator<Item = &[u8]> {
        self.slabs
            .iter()
            .map(|s| bytemuck::cast_slice(s.as_slice()))
    }

    /// Whether group `g`'s copy must be refreshed before it is bound.
    pub fn is_stale(&self, g: usize) -> bool {
        self.stale[g]
    }

    /// Marks every copy stale (the parameters were written from outside).
    pub fn mark_all_stale(&mut self) {
        self.stale.fill(true);
    }

    /// Group `g`'s copy, for the optimizer to write as it updates the group
    /// (it counts as fresh from then on).
    pub fn updated(&mut self, g: usize) -> &mut [bf16] {
        self.stale[g] = false;
        self.slabs[g].as_mut_slice()
    }

    /// Takes group `g`'s copy out for the optimizer to write (it counts as
    /// fresh from then on), leaving an empty slab until [`Bf16Weights::put`].
    pub(crate) fn take(&mut self, g: usize) -> Bf16Slab {
        self.stale[g] = false;
        std::mem::replace(&mut self.slabs[g], Bf16Slab::zeros(0))
    }

    /// Puts back what [`Bf16Weights::take`] took.
    pub(crate) fn put(&mut self, g: usize, slab: Bf16Slab) {
        self.slabs[g] = slab;
    }

    /// Rounds group `g`'s f32 `params` to bf16 (to nearest even) into its copy.
    pub fn refresh(&mut self, g: usize, params: &[f32]) {
        assert_eq!(
            params.len(),
            self.lens[g],
            "group {g}: parameters and copy differ in length"
        );
        round_into_par(self.updated(g), params);
    }

    /// Host bytes of the copies.
    pub fn bytes(&self) -> usize {
        // From the lengths: a slab may be out with the optimizer.
        self.lens
            .iter()
            .map(|n| n.div_ceil(2) * std::mem::size_of::<f32>())
            .sum()
    }
}
