//! burn-offload patch: the host bytes of uploads in flight, released once the
//! stream has passed them, without waiting.
//!
//! cubecl-runtime's `PendingDropQueue` waits, at every flush, for the fence
//! of the flush before. The server calls it on every `flush()` and every 64
//! staged uploads, on the device's server thread, so each flush held the
//! server (and every thread that waits on it, e.g. for a buffer's address)
//! until the GPU had caught up. One thread that drives two GPUs then waited
//! on one GPU while the other ran dry. Here a flush records a fence for the
//! staged bytes, frees the batches whose fences the stream has passed
//! (`cuEventQuery`), and waits only when the bytes still held pass a cap.

use std::collections::VecDeque;

use cubecl_common::bytes::Bytes;

use super::Fence;

/// Staged uploads that make a flush worth it (cubecl's default policy).
const FLUSH_COUNT: usize = 64;
const FLUSH_BYTES: u64 = 64 << 20;
/// Bytes (and batches) held for uploads in flight past which a flush waits
/// for the oldest.
const HELD_BYTES: u64 = 512 << 20;
const HELD_BATCHES: usize = 4096;

/// Host bytes read by uploads, kept until the stream has passed them.
#[derive(Debug, Default)]
pub struct DropQueue {
    staged: Vec<Bytes>,
    staged_bytes: u64,
    in_flight: VecDeque<(Fence, Vec<Bytes>, u64)>,
    held_bytes: u64,
}

impl DropQueue {
    /// Keeps `bytes` until the stream has passed the upload that reads them.
    pub fn push(&mut self, bytes: Bytes) {
        self.staged_bytes += bytes.len() as u64;
        self.staged.push(bytes);
    }

    /// Whether enough is staged to flush.
    pub fn should_flush(&self) -> bool {
        self.staged.len() >= FLUSH_COUNT || self.staged_bytes >= FLUSH_BYTES
    }

    /// Fences the staged bytes with `factory`'s fence (recorded on the stream
    /// now) and frees every batch the stream has passed.
    pub fn flush(&mut self, factory: impl Fn() -> Fence) {
        if !self.staged.is_empty() {
            let bytes = std::mem::take(&mut self.staged_bytes);
            self.held_bytes += bytes;
            self.in_flight
                .push_back((factory(), std::mem::take(&mut self.staged), bytes));
        }
        while let Some((fence, ..)) = self.in_flight.front() {
            let over = self.held_bytes > HELD_BYTES || self.in_flight.len() > HELD_BATCHES;
            if !over && !fence.is_reached() {
                break;
            }
            let (fence, batch, bytes) = self.in_flight.pop_front().expect("checked");
            let _ = fence.wait_sync();
            drop(batch);
            self.held_bytes -= bytes;
        }
    }
}
