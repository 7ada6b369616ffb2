//! Device copies of host-resident tensors: a byte-bounded LRU cache shared by
//! every `Offload` tensor, with traffic counters.
//!
//! A host tensor keeps its own device copy; this module only decides which
//! copies to drop when the cache is over its budget, and keeps the books:
//! those of the cache, and the bytes of the `Offload` tensors that live on
//! the device (operation results: activations, gradients), so a test or a
//! loop can see what a step holds there at most.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

/// Something host-resident with a device copy the cache manages.
pub trait Resident: Send + Sync {
    /// Drops the device copy; `true` if there was one.
    fn evict(&self) -> bool;
    /// Starts its copy to the device ahead of use, unless it is cached, not
    /// ready (an update of its values is still running) or needs none;
    /// `true` if a copy started.
    fn prefetch(self: Arc<Self>) -> bool;
}

struct Entry {
    id: u64,
    bytes: u64,
    owner: Weak<dyn Resident>,
}

struct State {
    /// Least recently used first.
    entries: VecDeque<Entry>,
    resident: u64,
    peak: u64,
    to_device: u64,
    budget: u64,
    /// Bytes of device tensors alive (see [`hold`]).
    held: u64,
    /// Largest `resident + held` since the last [`reset_peak`].
    device_peak: u64,
}

/// The cache's budget until [`set_param_cache_bytes`] changes it: enough for
/// a few transformer blocks of a billion-parameter model in f32.
pub const DEFAULT_PARAM_CACHE_BYTES: u64 = 1 << 30;

static STATE: Mutex<State> = Mutex::new(State {
    entries: VecDeque::new(),
    resident: 0,
    peak: 0,
    to_device: 0,
    budget: DEFAULT_PARAM_CACHE_BYTES,
    held: 0,
    device_peak: 0,
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Traffic and residency of host-resident `Offload` tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadStats {
    /// Bytes uploaded host → device.
    pub bytes_to_device: u64,
    /// Bytes of device copies cached now.
    pub resident_bytes: u64,
    /// Largest `resident_bytes` since the last [`reset_peak`].
    pub peak_resident_bytes: u64,
    /// The cache budget.
    pub budget_bytes: u64,
    /// Bytes on the device now: cached copies and the results of
    /// operations alive (an upper bound: two views of one buffer count
    /// twice).
    pub device_bytes: u64,
    /// Largest `device_bytes` since the last [`reset_peak`].
    pub peak_device_bytes: u64,
}

/// The page cache's counters now.
pub fn stats() -> OffloadStats {
    let s = state();
    OffloadStats {
        bytes_to_device: s.to_device,
        resident_bytes: s.resident,
        peak_resident_bytes: s.peak,
        budget_bytes: s.budget,
        device_bytes: s.resident + s.held,
        peak_device_bytes: s.device_peak,
    }
}

/// The cache budget.
pub(crate) fn budget() -> u64 {
    state().budget
}

/// Starts a new peak measurement from the current residency.
pub fn reset_peak() {
    let mut s = state();
    s.peak = s.resident;
    s.device_peak = s.resident + s.held;
}

/// Counts `bytes` of a device tensor that came to life.
pub(crate) fn hold(bytes: u64) {
    let mut s = state();
    s.held += bytes;
    s.device_peak = s.device_peak.max(s.resident + s.held);
}

/// Counts `bytes` of a device tensor gone.
pub(crate) fn release(bytes: u64) {
    let mut s = state();
    s.held -= bytes;
}

/// Sets how many bytes of device copies of host tensors may stay cached.
/// A single tensor larger than the budget is still paged in while it is used.
pub fn set_param_cache_bytes(bytes: u64) {
    let victims = {
        let mut s = state();
        s.budget = bytes;
        over_budget(&mut s, None)
    };
    evict_all(victims);
}

pub(crate) fn paged_in(id: u64, bytes: u64, owner: Weak<dyn Resident>) {
    let victims = {
        let mut s = state();
        s.to_device += bytes;
        s.resident += bytes;
        s.peak = s.peak.max(s.resident);
        s.device_peak = s.device_peak.max(s.resident + s.held);
        s.entries.push_back(Entry { id, bytes, owner });
        over_budget(&mut s, Some(id))
    };
    evict_all(victims);
}

pub(crate) fn touch(id: u64) {
    let mut s = state();
    if let Some(pos) = s.entries.iter().position(|e| e.id == id) {
        if let Some(entry) = s.entries.remove(pos) {
            s.entries.push_back(entry);
        }
    }
}

pub(crate) fn forget(id: u64) {
    let mut s = state();
    if let Some(pos) = s.entries.iter().position(|e| e.id == id) {
        if let Some(entry) = s.entries.remove(pos) {
            s.resident -= entry.bytes;
        }
    }
}

/// Removes least recently used entries (never `keep`) until within budget.
fn over_budget(s: &mut State, keep: Option<u64>) -> Vec<Weak<dyn Resident>> {
    let mut victims = Vec::new();
    let mut i = 0;
    while s.resident > s.budget && i < s.entries.len() {
        if Some(s.entries[i].id) == keep {
            i += 1;
            continue;
        }
        if let Some(entry) = s.entries.remove(i) {
            s.resident -= entry.bytes;
            victims.push(entry.owner);
        }
    }
    victims
}

/// Drops device copies outside the state lock (each takes its own lock).
fn evict_all(victims: Vec<Weak<dyn Resident>>) {
    for owner in victims {
        if let Some(owner) = owner.upgrade() {
            owner.evict();
        }
    }
}
