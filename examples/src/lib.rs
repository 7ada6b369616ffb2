//! Training programs for burn-offload, as a library so tests can drive them.

pub mod data;
pub mod plan;
pub mod preflight;
pub mod schedule;
pub mod train;

/// The backend the examples run on: burn-flex on the CPU by default, burn's
/// CUDA backend with `--features cuda`.
#[cfg(not(feature = "cuda"))]
pub type DefaultBackend = burn::backend::Flex;
#[cfg(feature = "cuda")]
pub type DefaultBackend = burn::backend::Cuda;

/// Resident set size of this process, from `/proc/self/statm` (Linux); `None` elsewhere.
pub fn process_rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
