//! The formats a frozen base weight can be held in on the host, and the
//! exact host bytes each takes (what the planner budgets with).

use std::fmt;
use std::str::FromStr;

use super::error::QuantError;
use super::nf4::NF4_BLOCK;
use crate::host::optim::quant::QUANT_BLOCK;

/// How a frozen base weight is held in host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum BaseDtype {
    /// bf16, 2 bytes a value (no quantisation).
    #[default]
    Bf16,
    /// int8 with an f32 absmax per output row ([`Int8Weight`](super::Int8Weight)).
    Int8,
    /// NF4 in blocks of 64 with double-quantised absmax
    /// ([`Nf4Weight`](super::Nf4Weight)).
    Nf4,
}

impl BaseDtype {
    /// Every format, in the order of their names.
    pub const ALL: [BaseDtype; 3] = [BaseDtype::Bf16, BaseDtype::Int8, BaseDtype::Nf4];

    /// The format's name, as [`FromStr`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            BaseDtype::Bf16 => "bf16",
            BaseDtype::Int8 => "int8",
            BaseDtype::Nf4 => "nf4",
        }
    }

    /// The exact host bytes of a `[out, in]` weight in this format:
    /// - bf16: `2 * numel`;
    /// - int8: `numel` codes and an f32 scale per row (`4 * out`);
    /// - NF4: `ceil(numel / 2)` packed bytes, a byte of absmax code per
    ///   block of 64, an f32 scale per 256 absmax codes, and the f32 offset.
    pub fn host_bytes(self, shape: [usize; 2]) -> usize {
        let numel = shape[0] * shape[1];
        match self {
            BaseDtype::Bf16 => 2 * numel,
            BaseDtype::Int8 => numel + 4 * shape[0],
            BaseDtype::Nf4 => {
                let blocks = numel.div_ceil(NF4_BLOCK);
                numel.div_ceil(2) + blocks + 4 * blocks.div_ceil(QUANT_BLOCK) + 4
            }
        }
    }

    /// [`host_bytes`](Self::host_bytes) per value (0 for an empty weight):
    /// 2 for bf16, about `1 + 4 / in` for int8, about
    /// `0.5 + 1/64 + 4/(64 * 256)` for NF4.
    pub fn bytes_per_param(self, shape: [usize; 2]) -> f64 {
        let numel = shape[0] * shape[1];
        if numel == 0 {
            return 0.0;
        }
        self.host_bytes(shape) as f64 / numel as f64
    }
}

impl fmt::Display for BaseDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BaseDtype {
    type Err = QuantError;

    /// `bf16`, `int8` or `nf4`, in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BaseDtype::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| QuantError::UnknownDtype(s.to_string()))
    }
}
