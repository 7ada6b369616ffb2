//! Training checkpoints: parameters and Adam state streamed from the host
//! slabs into safetensors files, plus a JSON manifest.
//!
//! Layout: `<dir>/step-<N>/{model.safetensors, optimizer.safetensors,
//! manifest.json}`. Tensors are named `stem.<path>` / `blocks.<i>.<path>`
//! (`m.`/`v.` prefixes in the optimizer file). Each tensor is a view of its
//! slab range, so writing makes no second copy of the model in memory.
//!
//! Crash safety: a checkpoint is written into `<dir>/.tmp-step-<N>`, every
//! file is fsynced, the manifest is written last, and only then is the folder
//! renamed to `step-<N>` (and the parent fsynced). A crash at any point leaves
//! earlier checkpoints untouched and, at worst, a `.tmp-*` folder that loading
//! ignores and the next write removes.

use std::borrow::Cow;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use safetensors::tensor::{Dtype, SafeTensors, View};
use serde::{Deserialize, Serialize};

use crate::store::{HostStore, Slab};

pub const FORMAT: &str = "burn-offload-checkpoint";
pub const FORMAT_VERSION: u32 = 1;
const MODEL_FILE: &str = "model.safetensors";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const MANIFEST_FILE: &str = "manifest.json";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no checkpoint in `{0}` (expected step-<N> folders with a manifest.json)")]
    NotFound(PathBuf),
    #[error("`{path}` is not a valid checkpoint manifest: {reason}")]
    Manifest { path: PathBuf, reason: String },
    #[error(
        "checkpoint `{path}` has format version {found}, this build reads version {FORMAT_VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("`{path}` is truncated or corrupted: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("checkpoint `{path}` does not fit this model: {reason}")]
    Mismatch { path: PathBuf, reason: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a checkpoint says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    /// Version of the burn-offload crate that wrote it.
    pub writer_version: String,
    /// Optimizer updates applied to the parameters.
    pub updates: u64,
    /// Parameter names and shapes per group (stem first).
    pub groups: Vec<Vec<(String, Vec<usize>)>>,
    /// CRC32 of `model.safetensors` and `optimizer.safetensors` (bit rot and
    /// partial writes that keep the header intact are caught on load).
    pub crc32: [u32; 2],
    /// Whatever the trainer needs to continue (config, step, RNG and data
    /// state), opaque to the library.
    pub trainer: serde_json::Value,
}

/// One slab range as a safetensors view (borrowed: no copy).
struct SlabView<'a> {
    shape: &'a [usize],
    data: &'a [f32],
}

impl View for SlabView<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        // Little-endian hosts store f32 exactly as safetensors wants it.
        Cow::Borrowed(bytemuck::cast_slice(self.data))
    }
    fn data_len(&self) -> usize {
        std::mem::size_of_val(self.data)
    }
}

fn tensor_name(group: usize, slot: &str) -> String {
    if group == 0 {
        format!("stem.{slot}")
    } else {
        format!("blocks.{}.{slot}", group - 1)
    }
}

fn views<'a>(
    store: &'a HostStore,
    prefix: &str,
    slab: impl Fn(usize) -> &'a Slab,
) -> Vec<(String, SlabView<'a>)> {
    let mut out = Vec::new();
    for (g, group) in store.groups.iter().enumerate() {
        let data = slab(g).as_slice();
        for slot in &group.slots {
            let view = SlabView {
                shape: &slot.shape,
                data: &data[slot.range()],
            };
            out.push((format!("{prefix}{}", tensor_name(g, &slot.name)), view));
        }
    }
    out
}

fn write_synced(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), CheckpointError>,
) -> Result<(), CheckpointError> {
    write(path)?;
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io(path))
}

fn sync_dir(path: &Path) -> Result<(), CheckpointError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io(path))
}

fn step_dir_name(updates: u64) -> String {
    format!("step-{updates:08}")
}

/// Writes a checkpoint of `store` after `updates` optimizer updates into
/// `dir/step-<updates>`, atomically; keeps the newest `keep` checkpoints.
/// Returns the checkpoint's folder.
pub fn save(
    dir: &Path,
    store: &HostStore,
    updates: u64,
    trainer: serde_json::Value,
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    remove_stale_temporaries(dir)?;
    let name = step_dir_name(updates);
    let tmp = dir.join(format!(".tmp-{name}"));
    fs::create_dir_all(&tmp).map_err(io(&tmp))?;

    let safetensors_error = |path: &Path| {
        let path = path.to_path_buf();
        move |e: safetensors::SafeTensorError| CheckpointError::Io {
            path,
            source: std::io::Error::other(e.to_string()),
        }
    };
    let model = tmp.join(MODEL_FILE);
    write_synced(&model, |p| {
        safetensors::serialize_to_file(views(store, "", |g| &store.groups[g].params), None, p)
            .map_err(safetensors_error(p))
    })?;
    pause_for_crash_tests();
    let optimizer = tmp.join(OPTIMIZER_FILE);
    write_synced(&optimizer, |p| {
        let mut all = views(store, "m.", |g| &store.groups[g].adam_m);
        all.extend(views(store, "v.", |g| &store.groups[g].adam_v));
        safetensors::serialize_to_file(all, None, p).map_err(safetensors_error(p))
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
        // Same step saved again (e.g. Ctrl-C right after a periodic save).
        fs::remove_dir_all(&target).map_err(io(&target))?;
    }
    fs::rename(&tmp, &target).map_err(io(&target))?;
    sync_dir(dir)?;
    prune(dir, keep)?;
    Ok(target)
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

/// Complete checkpoints under `dir`, oldest first.
pub fn list(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        let is_step = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("step-"));
        if is_step && path.join(MANIFEST_FILE).is_file() {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

fn prune(dir: &Path, keep: usize) -> Result<(), CheckpointError> {
    let all = list(dir)?;
    for old in all.iter().take(all.len().saturating_sub(keep.max(1))) {
        fs::remove_dir_all(old).map_err(io(old))?;
    }
    Ok(())
}

/// The checkpoint `path` points at: itself if it holds a manifest, else the
/// newest complete checkpoint inside it.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    if path.join(MANIFEST_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    if !path.is_dir() {
        return Err(CheckpointError::NotFound(path.to_path_buf()));
    }
    list(path)?
        .pop()
        .ok_or_else(|| CheckpointError::NotFound(path.to_path_buf()))
}

/// Reads and checks a checkpoint's manifest.
pub fn read_manifest(checkpoint: &Path) -> Result<Manifest, CheckpointError> {
    let path = checkpoint.join(MANIFEST_FILE);
    let text = fs::read_to_string(&path).map_err(io(&path))?;
    let manifest: Manifest =
        serde_json::from_str(&text).map_err(|e| CheckpointError::Manifest {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    if manifest.format != FORMAT {
        return Err(CheckpointError::Manifest {
            path,
            reason: format!("format is `{}`, not `{FORMAT}`", manifest.format),
        });
    }
    if manifest.format_version != FORMAT_VERSION {
        return Err(CheckpointError::Version {
            path,
            found: manifest.format_version,
        });
    }
    Ok(manifest)
}

/// Loads a checkpoint's parameters and Adam state into `store` (whose layout
/// must match the manifest). Checks everything before writing anything, so a
/// bad checkpoint leaves the store as it was. Returns the manifest.
pub fn load_into(checkpoint: &Path, store: &mut HostStore) -> Result<Manifest, CheckpointError> {
    let manifest = read_manifest(checkpoint)?;
    let layout = store.slot_table();
    if manifest.groups != layout {
        let describe = |g: &Vec<Vec<(String, Vec<usize>)>>| {
            let params: usize = g
                .iter()
                .flatten()
                .map(|(_, s)| s.iter().product::<usize>())
                .sum();
            format!("{} blocks, {params} parameters", g.len().saturating_sub(1))
        };
        return Err(CheckpointError::Mismatch {
            path: checkpoint.to_path_buf(),
            reason: format!(
                "it holds {}, the model has {}",
                describe(&manifest.groups),
                describe(&layout)
            ),
        });
    }
    let model = Mapped::open(&checkpoint.join(MODEL_FILE))?;
    let optimizer = Mapped::open(&checkpoint.join(OPTIMIZER_FILE))?;
    for (file, want) in [&model, &optimizer].into_iter().zip(manifest.crc32) {
        let got = file.crc32();
        if got != want {
            let reason = format!("checksum {got:08x} differs from the manifest's {want:08x}");
            return Err(CheckpointError::Corrupt {
                path: file.path.clone(),
                reason,
            });
        }
    }
    let (model_st, optim_st) = (model.parse()?, optimizer.parse()?);
    // Validate every tensor first.
    for (g, group) in store.groups.iter().enumerate() {
        for slot in &group.slots {
            let name = tensor_name(g, &slot.name);
            model.check(&model_st, &name, &slot.shape)?;
            optimizer.check(&optim_st, &format!("m.{name}"), &slot.shape)?;
            optimizer.check(&optim_st, &format!("v.{name}"), &slot.shape)?;
        }
    }
    for (g, group) in store.groups.iter_mut().enumerate() {
        for k in 0..group.slots.len() {
            let (name, range) = {
                let s = &group.slots[k];
                (tensor_name(g, &s.name), s.range())
            };
            copy_f32(
                model_st.tensor(&name).expect("checked").data(),
                &mut group.params.as_mut_slice()[range.clone()],
            );
            copy_f32(
                optim_st
                    .tensor(&format!("m.{name}"))
                    .expect("checked")
                    .data(),
                &mut group.adam_m.as_mut_slice()[range.clone()],
            );
            copy_f32(
                optim_st
                    .tensor(&format!("v.{name}"))
                    .expect("checked")
                    .data(),
                &mut group.adam_v.as_mut_slice()[range],
            );
        }
    }
    Ok(manifest)
}

fn copy_f32(bytes: &[u8], out: &mut [f32]) {
    out.par_chunks_mut(1 << 16)
        .zip(bytes.par_chunks(4 << 16))
        .for_each(|(o, b)| {
            for (x, c) in o.iter_mut().zip(b.chunks_exact(4)) {
                *x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        });
}

fn crc32(bytes: &[u8]) -> u32 {
    const CHUNK: usize = 8 << 20;
    bytes
        .par_chunks(CHUNK)
        .map(|c| {
            let mut h = crc32fast::Hasher::new();
            h.update(c);
            h
        })
        .collect::<Vec<_>>()
        .into_iter()
        .fold(crc32fast::Hasher::new(), |mut acc, h| {
            acc.combine(&h);
            acc
        })
        .finalize()
}

/// A memory-mapped safetensors file.
struct Mapped {
    path: PathBuf,
    map: memmap2::Mmap,
}

impl Mapped {
    fn open(path: &Path) -> Result<Self, CheckpointError> {
        let file = File::open(path).map_err(io(path))?;
        // SAFETY: the file is only read; checkpoints are never modified in
        // place (writes go to a new folder that is renamed into place).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(path))?;
        Ok(Self {
            path: path.to_path_buf(),
            map,
        })
    }

    fn parse(&self) -> Result<SafeTensors<'_>, CheckpointError> {
        SafeTensors::deserialize(&self.map).map_err(|e| CheckpointError::Corrupt {
            path: self.path.clone(),
            reason: e.to_string(),
        })
    }

    fn check(
        &self,
        st: &SafeTensors<'_>,
        name: &str,
        shape: &[usize],
    ) -> Result<(), CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt {
            path: self.path.clone(),
            reason,
        };
        let t = st
            .tensor(name)
            .map_err(|_| corrupt(format!("tensor `{name}` is missing")))?;
        if t.dtype() != Dtype::F32 || t.shape() != shape {
            return Err(corrupt(format!(
                "tensor `{name}` is {:?} {:?}, expected F32 {shape:?}",
                t.dtype(),
                t.shape()
            )));
        }
        Ok(())
    }

    /// CRC32 of the whole file, computed on parallel chunks and combined.
    fn crc32(&self) -> u32 {
        crc32(&self.map)
    }
}
