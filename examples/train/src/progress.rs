//! What a run shows while it trains: a progress bar on a terminal, and plain
//! lines every few seconds when stderr is a file or a pipe (nohup, SLURM, CI
//! logs), where a bar would print nothing.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Seconds between two plain progress lines (the first and the last step are
/// always shown).
pub const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// What one finished step reports.
#[derive(Debug, Clone, Copy)]
pub struct StepLine {
    /// Steps done, this one included.
    pub done: usize,
    /// The step's mean loss over its trained tokens.
    pub loss: f32,
    pub tokens_per_s: f64,
    /// Targets the step trained on.
    pub trained_tokens: usize,
}

/// A run's progress display, from step `start` (after a resume) to `steps`.
pub struct Progress {
    bar: ProgressBar,
    /// Plain lines instead of the bar: when the last was printed, and the
    /// last step's line when it was not.
    plain: Option<(Option<Instant>, Option<String>)>,
    start: usize,
    steps: usize,
    began: Instant,
}

impl Progress {
    /// Nothing shown unless `shown`; else a bar on a terminal, plain lines
    /// elsewhere. `prefix` names the model.
    pub fn new(shown: bool, prefix: String, start: usize, steps: usize) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let bar = if shown && terminal {
            bar(prefix, start, steps)
        } else {
            ProgressBar::hidden()
        };
        Self {
            bar,
            plain: (shown && !terminal).then_some((None, None)),
            start,
            steps,
            began: Instant::now(),
        }
    }

    /// Shows a finished step.
    pub fn step(&mut self, line: StepLine) {
        let message = format!(
            "loss {:.4} · {:.0} tok/s · {} trained tokens",
            line.loss, line.tokens_per_s, line.trained_tokens
        );
        self.bar.set_message(message.clone());
        self.bar.inc(1);
        let Some((last, pending)) = self.plain.as_mut() else {
            return;
        };
        let left = eta(self.start, line.done, self.steps, self.began.elapsed())
            .map_or("?".to_string(), |d| indicatif::HumanDuration(d).to_string());
        let text = format!(
            "step {}/{} · {message} · ETA {left}\n",
            line.done, self.steps
        );
        let due = last.is_none_or(|at| at.elapsed() >= PLAIN_EVERY) || line.done == self.steps;
        if due {
            *last = Some(Instant::now());
            *pending = None;
            print(&text);
        } else {
            *pending = Some(text);
        }
    }

    /// A line that stays (an evaluation's): above the bar, or among the
    /// plain lines after the step it follows.
    pub fn note(&mut self, text: &str) {
        if !self.bar.is_hidden() {
            self.bar.println(text);
        } else if let Some((_, pending)) = self.plain.as_mut() {
            if let Some(step) = pending.take() {
                print(&step);
            }
            print(&format!("{text}\n"));
        }
    }

    /// Ends the bar, or shows the last step's plain line if it was not.
    pub fn finish(&mut self) {
        self.bar.finish();
        if let Some((_, pending)) = self.plain.as_mut() {
            if let Some(text) = pending.take() {
                print(&text);
            }
        }
    }
}

/// Writes `text` to stderr in one piece: the lines of several processes
/// never interleave.
fn print(text: &str) {
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// The progress bar of a run that starts at step `start` (after a resume).
fn bar(prefix: String, start: usize, steps: usize) -> ProgressBar {
    let bar = ProgressBar::new(steps as u64);
    // indicatif's own ETA would count the resumed steps as done in no time.
    let style =
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} · ETA {run_eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key(
                "run_eta",
                move |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
                    let len = state.len().unwrap_or(0) as usize;
                    let _ = match eta(start, state.pos() as usize, len, state.elapsed()) {
                        Some(left) => write!(out, "{}", indicatif::HumanDuration(left)),
                        None => write!(out, "?"),
                    };
                },
            )
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(prefix);
    bar.set_position(start as u64);
    bar
}

/// Time left at step `pos` of `len` when the steps since `start` took
/// `elapsed`; `None` before the first of them ends.
pub fn eta(start: usize, pos: usize, len: usize, elapsed: Duration) -> Option<Duration> {
    let done = pos.checked_sub(start).filter(|&d| d > 0)?;
    Some(elapsed.mul_f64(len.saturating_sub(pos) as f64 / done as f64))
}

/// `124.4M`, `6.74B`.
pub fn human_count(n: usize) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}
