//! Page-ins ahead of use, from a trace of the step before.
//!
//! Every read of a host tensor by an operation is recorded, in order, between
//! two optimizer steps ([`end_step`], which [`super::HostParams`] calls). The
//! next step replays that trace: each read that matches the trace's next
//! entry starts the copies of the entries after it, up to half the page
//! cache's budget ahead, so a weight is on its way while the operations
//! before it run (the way ZeRO-3 prefetches from its first iteration's
//! trace). A read of a tensor the trace knows, out of its order, ends the
//! replay for the step, and the step's own order becomes the trace. Tensors
//! made during a step (a mask built with `from_data`) are new each step: the
//! replay passes over the trace's dead ones and ignores reads of ones it
//! does not know. Prefetching only fills the cache, so a wrong guess costs
//! copies, never values.

use std::collections::HashSet;
use std::sync::{Mutex, Weak};

use super::residency::{self, Resident};

/// Most reads recorded for one step: a loop with no optimizer steps
/// (inference) stops recording there instead of growing without end.
const MAX_RECORDED: usize = 1 << 20;

struct Read {
    id: u64,
    bytes: u64,
    owner: Weak<dyn Resident>,
}

struct Trace {
    /// The last recorded step's reads, in order.
    replay: Vec<Read>,
    /// The tensors `replay` reads.
    known: Option<HashSet<u64>>,
    /// This step's reads so far.
    recording: Vec<Read>,
    /// The next read expected from `replay`; `None` once this step left it.
    cursor: Option<usize>,
    /// This step's reads that matched the trace.
    matched: usize,
    stats: PrefetchStats,
}

/// What the trace prefetch did since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefetchStats {
    /// Optimizer steps seen ([`end_step`] calls).
    pub steps: u64,
    /// Steps whose reads followed the trace to its end.
    pub replayed: u64,
    /// Steps whose reads left the trace (their order was recorded instead).
    pub diverged: u64,
    /// Copies started ahead of use.
    pub copies: u64,
    /// Their bytes.
    pub bytes: u64,
}

static TRACE: Mutex<Trace> = Mutex::new(Trace {
    replay: Vec::new(),
    known: None,
    recording: Vec::new(),
    cursor: None,
    matched: 0,
    stats: PrefetchStats {
        steps: 0,
        replayed: 0,
        diverged: 0,
        copies: 0,
        bytes: 0,
    },
});

fn trace() -> std::sync::MutexGuard<'static, Trace> {
    TRACE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The prefetch's counters now.
pub fn stats() -> PrefetchStats {
    trace().stats
}

/// Records an operation's read of host tensor `id` (`bytes` on the device)
/// and starts the copies the trace expects next.
pub(crate) fn accessed(id: u64, bytes: u64, owner: Weak<dyn Resident>) {
    let ahead = {
        let mut t = trace();
        if t.recording.len() < MAX_RECORDED {
            t.recording.push(Read {
                id,
                bytes,
                owner: owner.clone(),
            });
        }
        let Some(mut c) = t.cursor else {
            return;
        };
        while t.replay.get(c).is_some_and(|r| r.owner.strong_count() == 0) {
            c += 1;
        }
        t.cursor = Some(c);
        if t.replay.get(c).is_some_and(|r| r.id == id) {
            t.cursor = Some(c + 1);
            t.matched += 1;
            upcoming(&t, c + 1)
        } else if t.known.as_ref().is_some_and(|known| known.contains(&id)) {
            t.cursor = None;
            Vec::new()
        } else {
            Vec::new()
        }
    };
    prefetch_all(ahead);
}

/// The owners of `replay[from..]`, up to half the cache budget of bytes.
/// Those already cached or with a copy started are passed over cheaply by
/// [`Resident::prefetch`]; those whose values are not ready yet (an update
/// still running) are tried again at the next read.
fn upcoming(t: &Trace, from: usize) -> Vec<(Weak<dyn Resident>, u64)> {
    let limit = residency::budget() / 2;
    let mut window = 0u64;
    let mut owners = Vec::new();
    for read in t.replay.iter().skip(from) {
        window += read.bytes;
        if window > limit {
            break;
        }
        owners.push((read.owner.clone(), read.bytes));
    }
    owners
}

/// Starts the copies, outside the trace's lock (a copy pages in).
fn prefetch_all(owners: Vec<(Weak<dyn Resident>, u64)>) {
    let (mut copies, mut bytes) = (0, 0);
    for (owner, size) in owners {
        if owner.upgrade().is_some_and(Resident::prefetch) {
            copies += 1;
            bytes += size;
        }
    }
    if copies > 0 {
        let mut t = trace();
        t.stats.copies += copies;
        t.stats.bytes += bytes;
    }
}

/// Ends a step: a step that followed the trace to its end keeps it, any
/// other becomes the trace; the next step's first copies start now.
pub fn end_step() {
    let ahead = {
        let mut t = trace();
        t.stats.steps += 1;
        let mut recording = std::mem::take(&mut t.recording);
        recording.retain(|r| r.owner.strong_count() > 0);
        // Every read of a living tensor matched, and none of the trace's was missed.
        let followed = t.matched > 0
            && t.matched == recording.len()
            && t.cursor.is_some_and(|c| {
                t.replay[c.min(t.replay.len())..]
                    .iter()
                    .all(|r| r.owner.strong_count() == 0)
            });
        if followed {
            t.stats.replayed += 1;
        } else {
            if !t.replay.is_empty() {
                t.stats.diverged += 1;
            }
            t.known = Some(recording.iter().map(|r| r.id).collect());
            t.replay = recording;
        }
        t.cursor = Some(0);
        t.matched = 0;
        upcoming(&t, 0)
    };
    prefetch_all(ahead);
}
