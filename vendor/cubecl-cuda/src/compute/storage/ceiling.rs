//! burn-offload patch: a device-wide ceiling on the bytes of pages the pools
//! of all of a device's streams hold.
//!
//! Each cubecl stream keeps its own pools, and a pool keeps the pages it has
//! grown to even while they are free: a process whose buffers never exceed
//! a budget still reserved far past it (free pages of one size class or one
//! stream cannot serve another). With a ceiling, a page that would take the
//! device past it is refused once; the stream then returns its free pages and
//! tries again, and only if that is not enough is the page allocated anyway
//! (a run the device can hold never fails for the ceiling).

use std::sync::atomic::{AtomicU64, Ordering};

/// The ceiling and what the device's pools hold now.
#[derive(Debug, Default)]
pub struct DeviceCeiling {
    /// Bytes the pools may hold before they give back their free pages
    /// (0: no ceiling).
    ceiling: u64,
    /// Bytes of pages allocated by every stream of the device.
    allocated: AtomicU64,
    /// Pages allocated past the ceiling (no free page was left to return).
    exceeded: AtomicU64,
}

impl DeviceCeiling {
    /// A ceiling of `bytes` (0: none).
    pub fn new(bytes: u64) -> Self {
        Self {
            ceiling: bytes,
            ..Self::default()
        }
    }

    /// Whether a ceiling is set.
    pub fn is_set(&self) -> bool {
        self.ceiling > 0
    }

    /// Whether a new page of `size` bytes would take the device past it.
    pub fn refuses(&self, size: u64) -> bool {
        self.is_set() && self.allocated.load(Ordering::Relaxed) + size > self.ceiling
    }

    /// Counts a page allocated (`past` it: the ceiling gave way).
    pub fn allocated(&self, size: u64, past: bool) {
        self.allocated.fetch_add(size, Ordering::Relaxed);
        if past {
            self.exceeded.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a page freed.
    pub fn freed(&self, size: u64) {
        self.allocated.fetch_sub(size, Ordering::Relaxed);
    }

    /// Pages allocated past the ceiling so far.
    pub fn exceeded(&self) -> u64 {
        self.exceeded.load(Ordering::Relaxed)
    }
}
