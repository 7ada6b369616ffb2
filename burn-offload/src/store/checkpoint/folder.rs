//! The folder one run writes its checkpoints into: its lock, atomic
//! writes, and the rotation that keeps the newest (and a pinned one).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{
    io, manifests, moment_views, step_dir_name, sync_dir, views, write_synced, CheckpointError,
    Manifest, Mapped, FORMAT, FORMAT_VERSION, LOCK_FILE, MANIFEST_FILE, MODEL_FILE, OPTIMIZER_FILE,
};
use crate::store::HostStore;

/// A checkpoint folder that one run owns for as long as this value lives.
///
/// Opening it takes the folder's lock, so a second process cannot write into
/// it at the same time, and checks that every checkpoint already there is
/// the same run's; saving rotates only that run's checkpoints.
#[derive(Debug)]
pub struct CheckpointDir {
    dir: PathBuf,
    run: String,
    keep: usize,
    next_sequence: u64,
    /// A checkpoint rotation never removes (the best one so far), beside
    /// the `keep` newest.
    pinned: Option<PathBuf>,
    /// Holds the advisory lock until dropped (or the process ends).
    _lock: File,
}

impl CheckpointDir {
    /// Creates `dir` if needed, locks it, and checks that it holds no
    /// checkpoint of a run other than `run`. At most `keep` (at least one)
    /// of the run's checkpoints are kept. Leftovers of an interrupted write
    /// are removed, now that no other process can be writing them.
    pub fn open(dir: &Path, run: &str, keep: usize) -> Result<Self, CheckpointError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let mut lock = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let holder = fs::read_to_string(&lock_path)
                    .ok()
                    .map(|text| text.trim().to_string())
                    .filter(|text| !text.is_empty());
                return Err(CheckpointError::Locked {
                    dir: dir.to_path_buf(),
                    holder,
                });
            }
            Err(fs::TryLockError::Error(error)) => return Err(io(&lock_path)(error)),
        }
        // Who holds the lock, for the message a second process prints; also
        // proves the folder writable before any training.
        lock.set_len(0)
            .and_then(|()| write!(lock, "pid {}", std::process::id()))
            .and_then(|()| lock.sync_all())
            .map_err(io(&lock_path))?;
        remove_stale_temporaries(dir)?;
        let mut next_sequence = 1;
        let mut others = Vec::new();
        for (path, manifest) in manifests(dir)? {
            let manifest = manifest?;
            if manifest.run == run {
                next_sequence = next_sequence.max(manifest.sequence + 1);
            } else {
                others.push((manifest.sequence, path));
            }
        }
        if let Some((_, newest)) = others.into_iter().max() {
            return Err(CheckpointError::OtherRun {
                dir: dir.to_path_buf(),
                newest,
            });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            run: run.to_string(),
            keep: keep.max(1),
            next_sequence,
            pinned: None,
            _lock: lock,
        })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Keeps `checkpoint` (one of this folder's) through every rotation,
    /// beside the `keep` newest, until another is pinned in its place
    /// (`None` unpins); the one unpinned goes now unless among the newest.
    pub fn pin(&mut self, checkpoint: Option<PathBuf>) -> Result<(), CheckpointError> {
        self.pinned = checkpoint;
        self.prune()
    }

    /// Writes a checkpoint of `store` after `updates` optimizer updates into
    /// `step-<updates>`, atomically, then removes the run's oldest written
    /// checkpoints beyond `keep`. Returns the checkpoint's folder.
    pub fn save(
        &mut self,
        store: &HostStore,
        updates: u64,
        trainer: serde_json::Value,
    ) -> Result<PathBuf, CheckpointError> {
        let dir = self.dir.clone();
        remove_stale_temporaries(&dir)?;
        let name = step_dir_name(updates);
        let tmp = dir.join(format!(".tmp-{name}"));
        fs::create_dir_all(&tmp).map_err(io(&tmp))?;

        let safetensors_error = |path: &Path| {
            let path = path.to_path_buf();
            move |e: safetensors::SafeTensorError| CheckpointError::Io {
                path,
                error: std::io::Error::other(e.to_string()),
            }
        };
        let model = tmp.join(MODEL_FILE);
        write_synced(&model, |p| {
            safetensors::serialize_to_file(
                views(store, "", |g| store.groups[g].params.as_slice()),
                None,
                p,
            )
            .map_err(safetensors_error(p))
        })?;
        pause_for_crash_tests();
        let optimizer = tmp.join(OPTIMIZER_FILE);
        write_synced(&optimizer, |p| {
            safetensors::serialize_to_file(moment_views(store), None, p)
                .map_err(safetensors_error(p))
        })?;
        let crc = [
            Mapped::open(&model)?.crc32(),
            Mapped::open(&optimizer)?.crc32(),
        ];
        let manifest = Manifest {
            crc32: crc,
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            writer_version: env!("CARGO_PKG_VERSION").into(),
            updates,
            run: self.run.clone(),
            sequence: self.next_sequence,
            groups: store.slot_table(),
            trainer,
        };
        let manifest_path = tmp.join(MANIFEST_FILE);
        write_synced(&manifest_path, |p| {
            let mut f = File::create(p).map_err(io(p))?;
            let json = serde_json::to_vec_pretty(&manifest).expect("manifest serialises");
            f.write_all(&json).map_err(io(p))
        })?;
        sync_dir(&tmp)?;

        let target = dir.join(&name);
        if target.exists() {
            // The run saved this step before: again right after a periodic
            // save (Ctrl-C), or in a branch it was resumed from an earlier
            // step of. The folder is locked and holds only this run's.
            remove_atomically(&target)?;
        }
        fs::rename(&tmp, &target).map_err(io(&target))?;
        sync_dir(&dir)?;
        self.next_sequence += 1;
        self.prune()?;
        Ok(target)
    }

    /// Removes the run's oldest written checkpoints beyond `keep`, never
    /// the pinned one.
    fn prune(&self) -> Result<(), CheckpointError> {
        let mut ours = Vec::new();
        for (path, manifest) in manifests(&self.dir)? {
            if let Ok(m) = manifest {
                if m.run == self.run {
                    ours.push((m.sequence, path));
                }
            }
        }
        ours.sort();
        let old = ours.len().saturating_sub(self.keep);
        for (_, path) in &ours[..old] {
            if self.pinned.as_ref() != Some(path) {
                remove_atomically(path)?;
            }
        }
        Ok(())
    }
}

/// Test hook: `BURN_OFFLOAD_CHECKPOINT_PAUSE_MS` sleeps in the middle of a
/// write, so the crash-safety test can kill the process there.
fn pause_for_crash_tests() {
    if let Some(ms) = std::env::var("BURN_OFFLOAD_CHECKPOINT_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Removes a checkpoint folder so that a crash never leaves half of it
/// looking complete: it is renamed to a temporary name first (which loading
/// ignores and the next write clears), then deleted.
fn remove_atomically(checkpoint: &Path) -> Result<(), CheckpointError> {
    let name = checkpoint
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let doomed = checkpoint.with_file_name(format!(".tmp-{name}.removed"));
    fs::rename(checkpoint, &doomed).map_err(io(checkpoint))?;
    fs::remove_dir_all(&doomed).map_err(io(&doomed))
}

fn remove_stale_temporaries(dir: &Path) -> Result<(), CheckpointError> {
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(".tmp-step-"))
        {
            fs::remove_dir_all(&path).map_err(io(&path))?;
        }
    }
    Ok(())
}
