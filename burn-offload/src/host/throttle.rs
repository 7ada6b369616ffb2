//! The forward's weight copies and the host optimizer share host memory
//! bandwidth, so the optimizer yields it while a copy runs.
//!
//! On the H100 a block's weight copy ran at about two thirds of its speed
//! while the worker's AdamW streamed the next blocks' slabs; holding each
//! update until the block before it had landed instead put the update on
//! the driving thread's path to the next bind (bench/results/cuda-bench,
//! runs 25 and 26). So the updates still run as soon as the step starts;
//! each of the optimizer's pieces (a few microseconds of work) first waits
//! while a copy is in flight. The engine opens a window before it issues a
//! block's copies and the copy stream closes it when they land
//! ([`crate::transfer::Pager::after_uploads`]).
//!
//! The count is process-wide because the rayon pool the optimizer runs on
//! is: two engines in one process share the host's memory bandwidth too.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Copies in flight, process-wide (the rayon pool the optimizer runs on is
/// process-wide too).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// An open window; closed when dropped.
struct Open;

impl Drop for Open {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Opens a copy's window; the returned closure closes it (call it when the
/// copy has landed). Dropped uncalled, say by a bind that panicked, it closes
/// the window too: the optimizer, process-wide, must not wait for ever.
pub fn copy_started() -> impl FnOnce() + Send + 'static {
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let open = Open;
    move || drop(open)
}

/// Returns once no window is open. A copy lasts milliseconds: the waiting
/// threads sleep in short steps rather than spin, leaving their cores to the
/// thread that drives the device.
pub fn wait_for_copies() {
    while IN_FLIGHT.load(Ordering::Relaxed) > 0 {
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Receiver};

    /// A thread that waits for the copies and then reports.
    fn waiter() -> Receiver<()> {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            wait_for_copies();
            let _ = tx.send(());
        });
        rx
    }

    /// A piece started while a copy is in flight waits until it lands; a
    /// window whose closer is dropped uncalled is closed too. (One test: the
    /// count is process-wide.)
    #[test]
    fn waits_while_a_window_is_open() {
        let landed = copy_started();
        let released = waiter();
        assert!(released.recv_timeout(Duration::from_millis(50)).is_err());
        landed();
        released
            .recv_timeout(Duration::from_secs(5))
            .expect("released once the copy landed");

        drop(copy_started());
        waiter()
            .recv_timeout(Duration::from_secs(5))
            .expect("an abandoned window is closed");
    }
}
