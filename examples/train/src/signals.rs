//! Ctrl-C (SIGINT) and SIGTERM: the first asks training to stop after the
//! current step and save a checkpoint; a second exits at once.
//!
//! The handler runs on its own thread (signal-hook's iterator), never inside
//! a signal context, so it may print and read the run's progress.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The first stop signal received (0: none).
static REQUESTED: AtomicI32 = AtomicI32::new(0);

/// What a second signal would lose, kept current by the training loop.
static PROGRESS: Mutex<Progress> = Mutex::new(Progress {
    steps_done: 0,
    saved: None,
    checkpointing: false,
});

/// How far the run is and what of it is on disk.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Steps completed so far (including those before a resume).
    pub steps_done: usize,
    /// The newest checkpoint on disk and its step, if any.
    pub saved: Option<(PathBuf, usize)>,
    /// Whether the run will save a checkpoint when it stops.
    pub checkpointing: bool,
}

/// Why the stop signals could not be routed.
#[derive(Debug, thiserror::Error)]
pub enum SignalsError {
    #[error("cannot install the SIGINT/SIGTERM handler: {0}")]
    Handler(#[source] std::io::Error),
    #[error("cannot start the signal thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Routes SIGINT and SIGTERM to [`requested`]; a second one of either exits
/// the process at once with 128 + the signal's number, saying what was not
/// saved.
pub fn install() -> Result<(), SignalsError> {
    let mut signals = Signals::new([SIGINT, SIGTERM]).map_err(SignalsError::Handler)?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if REQUESTED
                    .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    eprintln!(
                        "\n{}: stopping after this step{} (again to exit at once)",
                        name(signal),
                        if snapshot().checkpointing {
                            " with a checkpoint"
                        } else {
                            ""
                        }
                    );
                    continue;
                }
                eprintln!("\n{} again: exiting now; {}", name(signal), unsaved());
                std::process::exit(128 + signal);
            }
        })
        .map_err(SignalsError::Thread)?;
    Ok(())
}

/// The stop signal received, if any.
pub fn requested() -> Option<i32> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Records the run's progress for the message of a second signal.
pub fn update(progress: impl FnOnce(&mut Progress)) {
    let mut guard = PROGRESS.lock().unwrap_or_else(|e| e.into_inner());
    progress(&mut guard);
}

fn snapshot() -> Progress {
    PROGRESS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// `SIGINT`, `SIGTERM`.
pub fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

/// What exiting now would lose.
fn unsaved() -> String {
    let progress = snapshot();
    match (&progress.saved, progress.checkpointing) {
        (_, false) if progress.steps_done == 0 => "no step had finished yet".into(),
        (_, false) => "nothing was saved (no --checkpoint-dir given)".into(),
        (Some((path, step)), true) if *step == progress.steps_done => {
            format!("nothing is lost: `{}` holds step {step}", path.display())
        }
        (Some((path, step)), true) => format!(
            "steps {}..{} are not saved; the newest checkpoint is `{}` (step {step})",
            step + 1,
            progress.steps_done,
            path.display()
        ),
        (None, true) if progress.steps_done == 0 => "no step had finished yet".into(),
        (None, true) => format!(
            "no checkpoint was saved (the {} steps done are lost)",
            progress.steps_done
        ),
    }
}
