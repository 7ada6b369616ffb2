//! Quantised formats for a frozen base weight held in host memory (LoRA's
//! base): NF4 with double-quantised absmax as bitsandbytes and
//! QLoRA define it, and int8 with an absmax per output row as LLM.int8()
//! quantises weights; quantised and dequantised on the host (the
//! reference), dequantised on the device as burn tensor ops on any backend
//! (and, with the `cuda` feature, by one CubeCL kernel in `cuda/`).
//! Uses only `host` (bitsandbytes' dynamic 8-bit map of the 8-bit moments).

mod dtype;
mod error;
mod held;
mod int8;
mod nf4;
mod tensor;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_tensor;

pub use dtype::BaseDtype;
pub use error::QuantError;
pub use held::QuantizedRef;
pub use int8::{int8_step, quantize_int8, Int8Weight};
pub use nf4::{nf4_code, nf4_largest_gap, quantize_nf4, Nf4Weight, NF4, NF4_BLOCK, NF4_THRESHOLDS};
pub use tensor::{pack_words, Int8Tensors, Nf4Tensors};
