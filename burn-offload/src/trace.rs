//! Phase markers for finding where time and host memory go inside a step.
//!
//! With `BURN_OFFLOAD_TRACE=1` in the environment, each [`mark`] prints one
//! line to stderr: milliseconds since the previous mark, the process's
//! resident memory now and its peak so far (`VmRSS`, `VmHWM` from
//! `/proc/self/status`). A peak that jumps between two marks locates a
//! transient allocation. Without the variable a mark costs one relaxed load.

use std::fmt::Display;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// 0: not yet read from the environment, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
static LAST: Mutex<Option<Instant>> = Mutex::new(None);

/// Whether `BURN_OFFLOAD_TRACE` is set to something other than `0`.
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("BURN_OFFLOAD_TRACE").is_ok_and(|v| v != "0");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        state => state == 2,
    }
}

/// Prints `what` with the time since the previous mark and host memory.
pub fn mark(what: impl Display) {
    if !enabled() {
        return;
    }
    let now = Instant::now();
    let since = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .replace(now)
        .map_or(0.0, |last| (now - last).as_secs_f64() * 1e3);
    let (rss, peak) = host_memory();
    eprintln!(
        "[trace] +{since:9.1} ms  rss {:7.2} GiB  peak {:7.2} GiB  {what}",
        rss as f64 / (1u64 << 30) as f64,
        peak as f64 / (1u64 << 30) as f64
    );
}

/// `(VmRSS, VmHWM)` of this process in bytes; zeros where unavailable.
pub fn host_memory() -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (0, 0);
    };
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets the process's peak (`VmHWM`) to its current resident memory, so
/// the next [`host_memory`] reports the peak since now. Returns whether the
/// kernel allowed it (Linux, `/proc/self/clear_refs`).
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}
