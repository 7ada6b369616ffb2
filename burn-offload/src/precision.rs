//! The precision the device computes in.
//!
//! Master weights, Adam moments and gradient accumulation are f32 on the host
//! in every mode ("full precision" training). In a lower compute precision the
//! pager binds each block's weights in it, so the block's activations,
//! recompute and gradients follow; the loss is taken in f32 (as autocast
//! does), and burn's norms already reduce in f32.

use std::fmt;
use std::str::FromStr;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::backend::{Backend, DTypeUsage, DTypeUsageSet};
use burn::tensor::{bf16, DType, FloatDType, Tensor};
use rayon::prelude::*;

use crate::store::{HostStore, Slab};

/// Compute precision of the device (`--compute`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compute {
    /// f32 everywhere.
    #[default]
    Fp32,
    /// bf16 weights and activations on the device; gradients come back in
    /// bf16 and are added up in f32 on the host.
    Bf16,
}

impl Compute {
    pub const ALL: [Compute; 2] = [Compute::Fp32, Compute::Bf16];

    pub fn float_dtype(self) -> FloatDType {
        match self {
            Compute::Fp32 => FloatDType::F32,
            Compute::Bf16 => FloatDType::BF16,
        }
    }

    pub fn dtype(self) -> DType {
        self.float_dtype().into()
    }

    /// Bytes per element of weights, activations and gradients on the device.
    pub fn bytes(self) -> usize {
        match self {
            Compute::Fp32 => 4,
            Compute::Bf16 => 2,
        }
    }

    /// Whether backend `B` can compute in this precision on `device`: a
    /// clear error up front instead of a panic inside the first kernel.
    pub fn check<B: Backend>(self, device: &B::Device) -> Result<(), String> {
        check_usage(self, &B::name(device), B::dtype_usage(device, self.dtype()))
    }

    pub fn name(self) -> &'static str {
        match self {
            Compute::Fp32 => "fp32",
            Compute::Bf16 => "bf16",
        }
    }
}

fn check_usage(compute: Compute, backend: &str, usage: DTypeUsageSet) -> Result<(), String> {
    if usage.is_superset(DTypeUsage::general()) {
        return Ok(());
    }
    Err(format!(
        "the {backend} backend cannot compute in {compute} on this device (its {} support: {usage:?}); \
         use fp32 compute",
        compute.dtype().name()
    ))
}

impl fmt::Display for Compute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compute {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Compute::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "unknown compute precision `{s}`; expected one of: {}",
                    Compute::ALL.map(Compute::name).join(", ")
                )
            })
    }
}

/// `x` in `dtype` (no work when it already is).
pub fn cast_to<B: Backend, const D: usize>(x: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if x.dtype() == dtype {
        x
    } else {
        x.cast(dtype)
    }
}

/// bf16 copies of every group's parameters: what the pager uploads in bf16
/// mode (half the bytes of f32, and no cast kernel on the device, which
/// could not be ordered after the copy stream). A copy is refreshed right
/// after its group's update; anything else that writes parameters (loaders,
/// surgery) marks every copy stale, and a stale copy is refreshed before its
/// group is bound. Page-aligned like the store's slabs, so they can be pinned.
pub struct Bf16Weights {
    slabs: Vec<Slab>,
    lens: Vec<usize>,
    stale: Vec<bool>,
}

impl Bf16Weights {
    /// Stale copies sized for `store`'s groups (2 host bytes per parameter).
    pub fn new(store: &HostStore) -> Self {
        let lens: Vec<usize> = store.groups.iter().map(|g| g.numel()).collect();
        Self {
            // A slab of f32 holds two bf16 per element.
            slabs: lens.iter().map(|&n| Slab::zeros(n.div_ceil(2))).collect(),
            stale: vec![true; lens.len()],
            lens,
        }
    }

    /// Group `g`'s bf16 values (refreshed or not).
    pub fn values(&self, g: usize) -> &[bf16] {
        &bytemuck::cast_slice(self.slabs[g].as_slice())[..self.lens[g]]
    }

    /// The bytes of every copy, for pinning.
    pub fn slabs(&self) -> impl Iterator<Item = &[u8]> {
        self.slabs
            .iter()
            .map(|s| bytemuck::cast_slice(s.as_slice()))
    }

    pub fn is_stale(&self, g: usize) -> bool {
        self.stale[g]
    }

    pub fn mark_all_stale(&mut self) {
        self.stale.fill(true);
    }

    /// Group `g`'s copy, for the optimizer to write as it updates the group
    /// (it counts as fresh from then on).
    pub fn updated(&mut self, g: usize) -> &mut [bf16] {
        self.stale[g] = false;
        Self::values_in(&mut self.slabs[g], self.lens[g])
    }

    /// Takes group `g`'s copy out for the optimizer to write (it counts as
    /// fresh from then on), leaving an empty slab until [`Bf16Weights::put`].
    pub(crate) fn take(&mut self, g: usize) -> Slab {
        self.stale[g] = false;
        std::mem::replace(&mut self.slabs[g], Slab::zeros(0))
    }

    /// Puts back what [`Bf16Weights::take`] took.
    pub(crate) fn put(&mut self, g: usize, slab: Slab) {
        self.slabs[g] = slab;
    }

    /// Group `g`'s `len` bf16 values inside `slab` (a slab taken out).
    pub(crate) fn values_in(slab: &mut Slab, len: usize) -> &mut [bf16] {
        &mut bytemuck::cast_slice_mut(slab.as_mut_slice())[..len]
    }

    /// Rounds group `g`'s f32 `params` to bf16 (to nearest even) into its copy.
    pub fn refresh(&mut self, g: usize, params: &[f32]) {
        assert_eq!(
            params.len(),
            self.lens[g],
            "group {g}: parameters and copy differ in length"
        );
        self.updated(g)
            .par_chunks_mut(1 << 16)
            .zip(params.par_chunks(1 << 16))
            .for_each(|(o, p)| round_into(o, p));
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

/// Rounds `values` to bf16 (to nearest even) into `out` (same length).
pub(crate) fn round_into(out: &mut [bf16], values: &[f32]) {
    out.iter_mut()
        .zip(values)
        .for_each(|(o, v)| *o = bf16::from_f32(*v));
}

/// `module` with every float parameter cast to `dtype`, ids kept. Under
/// `Autodiff` the casts are recorded, so the gradients of a loss computed with
/// the cast module land, cast back, on the original (f32) parameters: the
/// resident baseline's mixed precision, like autocast's per-forward casts.
pub fn cast_params<B: Backend, M: Module<B>>(module: M, dtype: DType) -> M {
    struct CastParams(DType);
    impl<B: Backend> ModuleMapper<B> for CastParams {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let dtype = self.0;
            param.map(|t| cast_to(t, dtype))
        }
    }
    module.map(&mut CastParams(dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_without_the_dtype_is_a_clear_error() {
        let err = check_usage(Compute::Bf16, "ndarray", DTypeUsageSet::empty()).unwrap_err();
        assert!(
            err.contains("the ndarray backend cannot compute in bf16"),
            "{err}"
        );
        let storage_only = DTypeUsage::Storage.into();
        assert!(check_usage(Compute::Bf16, "x", storage_only).is_err());
        assert!(check_usage(Compute::Bf16, "x", DTypeUsage::general()).is_ok());
        assert!(Compute::Bf16
            .check::<burn::backend::Flex>(&Default::default())
            .is_ok());
    }

    #[test]
    fn names_round_trip_and_bad_names_are_explained() {
        for c in Compute::ALL {
            assert_eq!(c.name().parse::<Compute>().unwrap(), c);
        }
        let err = "tf16".parse::<Compute>().unwrap_err();
        assert!(err.contains("fp32, bf16"), "{err}");
    }
}
