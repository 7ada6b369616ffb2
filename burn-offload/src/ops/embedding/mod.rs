//! The embedding lookup's backward on the device: each token's positions of
//! `dy` summed in segments ([`crate::host::lookup::TokenRows`]), so only the
//! sums cross the bus.

mod base;
#[cfg(feature = "cuda")]
mod cuda;

pub(crate) use base::segment_sums;
