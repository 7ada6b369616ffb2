//! The quantised formats' errors.

use thiserror::Error;

/// What quantising, dequantising or naming a base format can fail with.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// A format name other than `bf16`, `int8` or `nf4`.
    #[error("unknown base dtype `{0}` (expected bf16, int8 or nf4)")]
    UnknownDtype(String),
    /// A slice whose length is not the weight's `out * in`.
    #[error("{len} values for a weight of shape {shape:?}")]
    Length {
        /// The slice's length.
        len: usize,
        /// The weight's `[out, in]`.
        shape: [usize; 2],
    },
    /// Device tensors whose sizes do not fit the weight they claim to hold.
    #[error(
        "device tensors of {what} hold {got} values, the weight of shape {shape:?} needs {want}"
    )]
    Tensors {
        /// Which tensor.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the weight needs.
        want: usize,
        /// The weight's `[out, in]`.
        shape: [usize; 2],
    },
}

impl QuantError {
    /// `Ok` when `len` values make a weight of `shape`, else
    /// [`QuantError::Length`].
    pub(crate) fn check_length(len: usize, shape: [usize; 2]) -> Result<(), QuantError> {
        if len == shape[0] * shape[1] {
            Ok(())
        } else {
            Err(QuantError::Length { len, shape })
        }
    }
}
