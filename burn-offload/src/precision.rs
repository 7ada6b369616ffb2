//! The precision the device computes in.
//!
//! Master weights, Adam moments and gradient accumulation are f32 on the host
//! in every mode ("full precision" training). In a lower compute precision the
//! pager binds each block's weights in it, so the block's activations,
//! recompute and gradients follow; the loss is taken in f32 (as autocast
//! does), and burn's norms already reduce in f32.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::backend::{Backend, DTypeUsage, DTypeUsageSet};
use burn::tensor::{DType, FloatDType, Tensor};

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

/// A compute precision a backend cannot run, or a name that is none.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PrecisionError {
    /// The backend lacks general support for the precision's dtype.
    #[error(
        "the {backend} backend cannot compute in {compute} on this device (its {dtype} support: \
         {usage}); use fp32 compute"
    )]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// The precision asked for.
        compute: Compute,
        /// Its dtype's name.
        dtype: &'static str,
        /// What the backend supports of it.
        usage: String,
    },
    /// Not the name of a precision.
    #[error("unknown compute precision `{0}`; expected one of: fp32, bf16")]
    Unknown(String),
}

impl Compute {
    /// Every precision.
    pub const ALL: [Compute; 2] = [Compute::Fp32, Compute::Bf16];

    /// Its float dtype.
    pub fn float_dtype(self) -> FloatDType {
        match self {
            Compute::Fp32 => FloatDType::F32,
            Compute::Bf16 => FloatDType::BF16,
        }
    }

    /// Its dtype.
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
    pub fn check<B: Backend>(self, device: &B::Device) -> Result<(), PrecisionError> {
        check_usage(self, &B::name(device), B::dtype_usage(device, self.dtype()))
    }

    /// Its name on the command line (`fp32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Compute::Fp32 => "fp32",
            Compute::Bf16 => "bf16",
        }
    }
}

fn check_usage(
    compute: Compute,
    backend: &str,
    usage: DTypeUsageSet,
) -> Result<(), PrecisionError> {
    if usage.is_superset(DTypeUsage::general()) {
        return Ok(());
    }
    Err(PrecisionError::Unsupported {
        backend: backend.to_string(),
        compute,
        dtype: compute.dtype().name(),
        usage: format!("{usage:?}"),
    })
}

impl fmt::Display for Compute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compute {
    type Err = PrecisionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Compute::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| PrecisionError::Unknown(s.to_string()))
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

/// `module` with every float parameter but those in `skip` replaced by a new
/// leaf: its value cast to `dtype`, requiring a gradient where the parameter
/// did (ids kept). Nothing is recorded: the gradients land on the cast
/// leaves, in `dtype` (what binding the weights in `dtype` gives, from f32
/// weights on the device). Parameters that were not bound (the blocks'
/// placeholders in a bound stem) go in `skip`: casting a placeholder would
/// write out its whole shape.
pub fn cast_leaves<B: Backend, M: Module<B>>(
    module: M,
    dtype: DType,
    skip: &HashSet<ParamId>,
) -> M {
    struct CastLeaves<'a>(DType, &'a HashSet<ParamId>);
    impl<B: Backend> ModuleMapper<B> for CastLeaves<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            if self.1.contains(&param.id) {
                return param;
            }
            let id = param.id;
            let value = param.into_value();
            let require_grad = value.is_require_grad();
            let cast = cast_to(value, self.0)
                .detach()
                .set_require_grad(require_grad);
            Param::initialized(id, cast)
        }
    }
    module.map(&mut CastLeaves(dtype, skip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_without_the_dtype_is_a_clear_error() {
        let err = check_usage(Compute::Bf16, "ndarray", DTypeUsageSet::empty()).unwrap_err();
        assert!(
            matches!(&err, PrecisionError::Unsupported { backend, compute: Compute::Bf16, .. } if backend == "ndarray"),
            "{err}"
        );
        let storage_only = DTypeUsage::Storage.into();
        assert!(check_usage(Compute::Bf16, "x", storage_only).is_err());
        assert!(check_usage(Compute::Bf16, "x", DTypeUsage::general()).is_ok());
        assert!(Compute::Bf16
            .check::<burn::backend::Flex>(&Default::default())
            .is_ok());
    }

    /// Skipped parameters (a bound stem's block placeholders) stay as they
    /// are; the others become leaves in the compute precision.
    #[test]
    fn cast_leaves_skips_what_was_not_bound() {
        use burn::nn::{Linear, LinearConfig};
        type F = burn::backend::Flex;
        #[derive(burn::module::Module, Debug)]
        struct Two<B: Backend> {
            bound: Linear<B>,
            placeholder: Linear<B>,
        }
        let device = Default::default();
        let two = Two::<F> {
            bound: LinearConfig::new(4, 3).init(&device),
            placeholder: LinearConfig::new(4, 3).with_bias(false).init(&device),
        };
        let skip: HashSet<ParamId> = [two.placeholder.weight.id].into_iter().collect();
        let cast = cast_leaves(two, DType::BF16, &skip);
        assert_eq!(cast.bound.weight.val().dtype(), DType::BF16);
        assert_eq!(
            cast.bound.bias.as_ref().expect("bias").val().dtype(),
            DType::BF16
        );
        assert_eq!(cast.placeholder.weight.val().dtype(), DType::F32);
    }

    #[test]
    fn names_round_trip_and_bad_names_are_explained() {
        for c in Compute::ALL {
            assert_eq!(c.name().parse::<Compute>().unwrap(), c);
        }
        let err = "tf16".parse::<Compute>().unwrap_err();
        assert_eq!(err, PrecisionError::Unknown("tf16".into()));
        assert!(err.to_string().contains("fp32, bf16"), "{err}");
    }
}
