//! A run of several processes, one GPU each (`train --rank R --world-size N
//! --rendezvous HOST:PORT`), and the launcher that starts them on one host
//! (`train --processes N`).
//!
//! Each process builds its own engine and host store from the same seed (or
//! checkpoint), draws the same micro-batches, trains on its share and sums
//! gradients with the others (NCCL on CUDA; on CPU builds, through the
//! rendezvous links), so every store takes the same update. Rank 0 writes
//! the checkpoints, the metrics, the export and the sample.

use std::ffi::OsString;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use burn_offload::{ProcessError, ProcessGroup};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// How long the ranks wait for each other at the rendezvous.
pub const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(300);

/// One process's place in a run of several.
#[derive(Debug, Clone, PartialEq)]
pub struct RankOptions {
    /// This process's rank, below `world_size`; rank 0 listens at the
    /// rendezvous address and writes the run's outputs.
    pub rank: usize,
    /// Processes in the run, on every host.
    pub world_size: usize,
    /// `host:port` where rank 0 listens.
    pub rendezvous: String,
    /// This process's GPU on its host (CUDA builds).
    pub local_rank: usize,
    /// Processes on this host, which share its memory: each plans with
    /// that share.
    pub local_world_size: usize,
    /// Where the place came from, which the refusals name.
    pub source: PlaceSource,
}

/// Who gave a process its place in a run of several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlaceSource {
    /// `--rank`/`--world-size`, or the launcher of `--processes`.
    #[default]
    Flags,
    /// torchrun's environment variables (`RANK`, `WORLD_SIZE`, …).
    Torchrun,
    /// SLURM's environment variables (`SLURM_PROCID`, `SLURM_NTASKS`, …).
    Slurm,
}

impl PlaceSource {
    /// What set the world size, as a refusal names it.
    pub fn world_size_name(self) -> &'static str {
        match self {
            PlaceSource::Flags => "--world-size",
            PlaceSource::Torchrun => "WORLD_SIZE (torchrun's environment)",
            PlaceSource::Slurm => "SLURM_NTASKS (srun's environment)",
        }
    }
}

/// A place in a run of several processes that cannot be.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("--world-size must be at least 2 for a run of several processes, got {0}")]
    WorldSize(usize),
    #[error("--rank {rank} is not below --world-size {world_size}")]
    Rank { rank: usize, world_size: usize },
    #[error(
        "--local-world-size {local_world_size} must be between 1 and --world-size {world_size}"
    )]
    LocalWorldSize {
        local_world_size: usize,
        world_size: usize,
    },
    #[error("--local-rank {local_rank} is not below --local-world-size {local_world_size}")]
    LocalRank {
        local_rank: usize,
        local_world_size: usize,
    },
}

/// The run's processes could not meet, or exchange what they must; the
/// message names this process's rank (the group's error is part of it
/// rather than its source, so that error-chain printers do not repeat it).
#[derive(Debug, thiserror::Error)]
#[error("rank {rank}: {error}")]
pub struct RankError {
    pub rank: usize,
    pub error: ProcessError,
}

/// Why `train --processes N` could not start or watch its ranks.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("--processes must be at least 2, got {0}")]
    TooFew(usize),
    #[error("cannot find a free port for the rendezvous: {0}")]
    NoFreePort(std::io::Error),
    #[error("cannot install the launcher's signal handler: {0}")]
    SignalHandler(std::io::Error),
    #[error("cannot find this program to start its ranks: {0}")]
    NoProgram(std::io::Error),
    #[error("cannot start rank {rank}: {error}")]
    Start { rank: usize, error: std::io::Error },
    /// Another call to the OS failed (starting the signal thread, waiting
    /// for a rank): its own words.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl RankOptions {
    /// Refuses a place that cannot be: ranks below the world size, local
    /// ranks below the local world size, which is at most the world.
    pub fn validate(&self) -> Result<(), PlaceError> {
        if self.world_size < 2 {
            return Err(PlaceError::WorldSize(self.world_size));
        }
        if self.rank >= self.world_size {
            return Err(PlaceError::Rank {
                rank: self.rank,
                world_size: self.world_size,
            });
        }
        if self.local_world_size == 0 || self.local_world_size > self.world_size {
            return Err(PlaceError::LocalWorldSize {
                local_world_size: self.local_world_size,
                world_size: self.world_size,
            });
        }
        if self.local_rank >= self.local_world_size {
            return Err(PlaceError::LocalRank {
                local_rank: self.local_rank,
                local_world_size: self.local_world_size,
            });
        }
        Ok(())
    }

    /// Meets the other ranks at the rendezvous.
    pub fn join(&self) -> Result<Arc<ProcessGroup>, RankError> {
        let group = ProcessGroup::join(
            self.rank,
            self.world_size,
            &self.rendezvous,
            RENDEZVOUS_TIMEOUT,
        )
        .map_err(|error| RankError {
            rank: self.rank,
            error,
        })?;
        Ok(Arc::new(group))
    }
}

/// The signal that stops the run, agreed by every process: the first
/// rank's that got one (a Ctrl-C reaches every process on a terminal; a
/// scheduler's SIGTERM may reach one), so all stop at the same step.
pub fn agree_on_signal(
    group: &ProcessGroup,
    signal: Option<i32>,
) -> Result<Option<i32>, RankError> {
    let mine = signal.unwrap_or(0).to_le_bytes();
    let all = group.all_gather(&mine).map_err(|error| RankError {
        rank: group.rank(),
        error,
    })?;
    Ok(all
        .iter()
        .map(|b| i32::from_le_bytes(b[..4].try_into().unwrap_or_default()))
        .find(|&s| s != 0))
}

/// The arguments of rank `rank` of `n` started by the launcher: the
/// launcher's own, less `--processes`, plus the rank's place.
pub fn rank_args(args: &[OsString], rank: usize, n: usize, rendezvous: &str) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len() + 10);
    let mut skip_value = false;
    for arg in args {
        if skip_value {
            skip_value = false;
            continue;
        }
        match arg.to_str() {
            Some("--processes") => skip_value = true,
            Some(a) if a.starts_with("--processes=") => {}
            _ => out.push(arg.clone()),
        }
    }
    for (flag, value) in [
        ("--rank", rank.to_string()),
        ("--world-size", n.to_string()),
        ("--local-rank", rank.to_string()),
        ("--local-world-size", n.to_string()),
        ("--rendezvous", rendezvous.to_string()),
    ] {
        out.push(flag.into());
        out.push(value.into());
    }
    out
}

/// A free TCP port on the loopback interface, for the launcher's rendezvous.
pub fn free_loopback_address() -> Result<String, LaunchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(LaunchError::NoFreePort)?;
    let port = listener.local_addr()?.port();
    Ok(format!("127.0.0.1:{port}"))
}

/// `train --processes N`: starts ranks 0..N of this program on this host
/// (rank `r` on GPU `r`) with the launcher's other arguments, and waits for
/// them. Once one fails, the others get a grace period to notice (their
/// links to it break) and are then ended: a rank waiting in a collective
/// would wait for ever. Returns the first failure's status, else the status
/// of ranks a signal stopped, else success.
pub fn launch(n: usize, args: &[OsString]) -> Result<ExitStatus, LaunchError> {
    if n < 2 {
        return Err(LaunchError::TooFew(n));
    }
    // A terminal's Ctrl-C reaches every rank itself (one process group);
    // the launcher outlives it and waits for their checkpoints. A SIGTERM
    // sent to the launcher alone is passed on to every rank.
    let terms = Arc::new(AtomicUsize::new(0));
    let mut signals = Signals::new([SIGINT, SIGTERM]).map_err(LaunchError::SignalHandler)?;
    let counted = terms.clone();
    std::thread::Builder::new()
        .name("launcher-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if signal == SIGTERM {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            }
        })?;
    let mut passed_on = 0;
    let program = std::env::current_exe().map_err(LaunchError::NoProgram)?;
    let rendezvous = free_loopback_address()?;
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(n);
    for rank in 0..n {
        let child = Command::new(&program)
            .args(rank_args(args, rank, n, &rendezvous))
            .spawn();
        match child {
            Ok(child) => children.push((rank, child)),
            Err(error) => {
                end_all(&mut children);
                return Err(LaunchError::Start { rank, error });
            }
        }
    }
    let mut failed: Option<(usize, ExitStatus)> = None;
    let mut failed_at = None;
    // Ranks stopped by a signal, each after the same step and rank 0's
    // checkpoint: the launcher exits as they did.
    let mut stopped: Option<ExitStatus> = None;
    while !children.is_empty() {
        let mut still = Vec::with_capacity(children.len());
        for (rank, mut child) in children {
            match child.try_wait()? {
                Some(status) if stopped_by_signal(status) => stopped = Some(status),
                Some(status) => {
                    if !status.success() && failed.is_none() {
                        failed = Some((rank, status));
                        failed_at = Some(std::time::Instant::now());
                    }
                }
                None => still.push((rank, child)),
            }
        }
        children = still;
        let received = terms.load(Ordering::SeqCst);
        while passed_on < received {
            for (_, child) in &children {
                // SAFETY: a plain kill(2) of a child this process started
                // and has not reaped.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            }
            passed_on += 1;
        }
        if failed_at.is_some_and(|at| at.elapsed() > FAILURE_GRACE) {
            end_all(&mut children);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    match (failed, stopped) {
        (Some((rank, status)), _) => {
            eprintln!("error: rank {rank} of {n} failed ({status})");
            Ok(status)
        }
        (None, Some(status)) => Ok(status),
        (None, None) => Ok(ExitStatus::default()),
    }
}

/// How long the other ranks get, after one fails, to notice and end.
const FAILURE_GRACE: Duration = Duration::from_secs(10);

/// Whether a rank ended as `train` does when SIGINT or SIGTERM stops it.
fn stopped_by_signal(status: ExitStatus) -> bool {
    matches!(status.code(), Some(code) if code == 128 + SIGINT || code == 128 + SIGTERM)
}

/// Ends every child still running and reaps it.
fn end_all(children: &mut Vec<(usize, Child)>) {
    for (_, child) in children.iter_mut() {
        let _ = child.kill();
    }
    for (_, mut child) in children.drain(..) {
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_gets_the_launchers_arguments_and_its_place() {
        let args: Vec<OsString> = [
            "--steps",
            "3",
            "--processes",
            "2",
            "--processes=2",
            "--seed",
            "1",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let got: Vec<String> = rank_args(&args, 1, 2, "127.0.0.1:9")
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            got.join(" "),
            "--steps 3 --seed 1 --rank 1 --world-size 2 --local-rank 1 \
             --local-world-size 2 --rendezvous 127.0.0.1:9"
        );
    }

    #[test]
    fn impossible_places_are_refused() {
        let place = RankOptions {
            rank: 0,
            world_size: 2,
            rendezvous: "127.0.0.1:9".into(),
            local_rank: 0,
            local_world_size: 2,
            source: PlaceSource::Flags,
        };
        assert!(place.validate().is_ok());
        for (bad, why) in [
            (
                RankOptions {
                    rank: 2,
                    ..place.clone()
                },
                "--rank 2 is not below --world-size 2",
            ),
            (
                RankOptions {
                    world_size: 1,
                    rank: 0,
                    ..place.clone()
                },
                "--world-size must be at least 2",
            ),
            (
                RankOptions {
                    local_rank: 2,
                    ..place.clone()
                },
                "--local-rank 2 is not below",
            ),
            (
                RankOptions {
                    local_world_size: 3,
                    ..place.clone()
                },
                "--local-world-size 3 must be",
            ),
        ] {
            let error = bad.validate().unwrap_err().to_string();
            assert!(error.contains(why), "{error}");
        }
    }
}
