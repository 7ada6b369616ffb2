//! Training programs for burn-offload, as a library so tests can drive them.

pub mod chat;
pub mod config;
pub mod data;
pub mod error_line;
pub mod export;
pub mod generate;
pub mod instruct;
pub mod launcher_env;
pub mod links;
pub mod load;
pub mod metrics;
pub mod options;
pub mod outputs;
pub mod plan;
pub mod preflight;
pub mod processes;
pub mod progress;
pub mod run;
pub mod sample;
pub mod sampling;
pub mod schedule;
pub mod signals;
pub mod tokenizer;

/// The backend the examples run on: burn-flex on the CPU by default, burn's
/// CUDA backend with `--features cuda`, under `Gemm` so that `--matmul` can
/// choose its matmul kernel (with `auto`, `Gemm<Cuda>` computes as `Cuda`).
#[cfg(not(feature = "cuda"))]
pub type DefaultBackend = burn::backend::Flex;
#[cfg(feature = "cuda")]
pub type DefaultBackend = burn_offload::Gemm<burn::backend::Cuda>;

/// Resident set size of this process (`VmRSS`, Linux); `None` elsewhere.
pub fn process_rss_bytes() -> Option<u64> {
    let (rss, _) = burn_offload::trace::host_memory();
    (rss > 0).then_some(rss)
}

/// The process's peak resident memory (`VmHWM`) since the last
/// [`burn_offload::trace::reset_peak`], where the kernel allows resetting it.
pub fn peak_rss_bytes() -> Option<u64> {
    let (_, peak) = burn_offload::trace::host_memory();
    (peak > 0).then_some(peak)
}
