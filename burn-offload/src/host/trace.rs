//! Phase markers for finding where time and host memory go inside a step.
//!
//! With `BURN_OFFLOAD_TRACE=1` in the environment, each [`mark`] prints one
//! line to stderr: milliseconds since the previous mark (on any thread) and
//! since the first, the process's resident memory now and its peak so far
//! (`VmRSS`, `VmHWM` from `/proc/self/status`), and the marking thread's name
//! where it has one other than `main` (the host worker's marks interleave with
//! the driving thread's). A peak that jumps between two marks locates a
//! transient allocation. Without the variable a mark costs one relaxed load.

use std::fmt::Display;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// 0: not yet read from the environment, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
/// The first mark's time and the previous one's.
static LAST: Mutex<Option<(Instant, Instant)>> = Mutex::new(None);

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
    let (first, last) = {
        let mut times = LAST
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (first, last) = times.unwrap_or((now, now));
        *times = Some((first, now));
        (first, last)
    };
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let (since, at) = (ms(now - last), ms(now - first));
    let (rss, peak) = host_memory();
    let thread = std::thread::current();
    let thread = thread.name().filter(|&n| n != "main").unwrap_or("");
    eprintln!(
        "[trace] +{since:9.1} ms  @{at:10.1}  rss {:7.2} GiB  peak {:7.2} GiB  {thread:>5} {what}",
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
