//! Training checkpoints: parameters and Adam state streamed from the host
//! slabs into safetensors files, plus a JSON manifest.
//!
//! Layout: `<dir>/step-<N>/{model.safetensors, optimizer.safetensors,
//! manifest.json}`. Tensors are named `stem.<path>` / `blocks.<i>.<path>`
//! (`m.`/`v.` prefixes in the optimizer file; 8-bit moments are stored per
//! group as `m8.<group>` codes with `m8.<group>.absmax` scales, and `v8.`).
//! Each tensor is a view of its slab range, so writing makes no second copy
//! of the model in memory.
//!
//! Crash safety: a checkpoint is written into `<dir>/.tmp-step-<N>`, every
//! file is fsynced, the manifest is written last, and only then is the folder
//! renamed to `step-<N>` (and the parent fsynced). A crash at any point leaves
//! earlier checkpoints untouched and, at worst, a `.tmp-*` folder that loading
//! ignores and the next write removes.
//!
//! Ownership: a folder belongs to one run at a time. [`CheckpointDir::open`]
//! takes an advisory lock on `<dir>/.lock` (released by the OS when the
//! process ends, even by `kill -9`) and refuses a folder that holds another
//! run's checkpoints. Each checkpoint records its run and a write sequence
//! number, so rotation removes only the run's own checkpoints, oldest written
//! first, and [`resolve`] picks the newest written one (not the highest step:
//! a run resumed from an earlier step writes lower step numbers again).

use std::borrow::Cow;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use safetensors::tensor::{Dtype, SafeTensors, View};
use serde::{Deserialize, Serialize};

use super::{HostStore, Moments};

mod folder;
pub use folder::CheckpointDir;

/// The manifest's `format`.
pub const FORMAT: &str = "burn-offload-checkpoint";
/// The manifest format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const MODEL_FILE: &str = "model.safetensors";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const MANIFEST_FILE: &str = "manifest.json";
const LOCK_FILE: &str = ".lock";

/// Why a checkpoint could not be written, found or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    // The OS error is part of the message rather than a `source`, so that
    // error-chain printers do not repeat it.
    /// A file operation failed.
    #[error("`{}`: {error}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// Another process holds the folder's lock.
    #[error("checkpoint folder `{}` is in use by another run{}", dir.display(), holder.as_ref().map(|h| format!(" ({h})")).unwrap_or_default())]
    Locked {
        /// The folder.
        dir: PathBuf,
        /// Who holds it, where known.
        holder: Option<String>,
    },
    /// The folder holds another run's checkpoints.
    #[error("checkpoint folder `{}` holds checkpoints of another run (newest: `{}`)", dir.display(), newest.display())]
    OtherRun {
        /// The folder.
        dir: PathBuf,
        /// Its newest checkpoint.
        newest: PathBuf,
    },
    /// No checkpoint where one was expected.
    #[error("no checkpoint in `{0}` (expected step-<N> folders with a manifest.json)")]
    NotFound(PathBuf),
    /// A manifest that does not parse.
    #[error("`{path}` is not a valid checkpoint manifest: {reason}")]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A manifest of another format version.
    #[error(
        "checkpoint `{path}` has format version {found}, this build reads version {FORMAT_VERSION}"
    )]
    Version {
        /// The checkpoint.
        path: PathBuf,
        /// Its format version.
        found: u32,
    },
    /// A data file whose bytes do not check out.
    #[error("`{path}` is truncated or corrupted: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint of another model.
    #[error("checkpoint `{path}` does not fit this model: {reason}")]
    Mismatch {
        /// The checkpoint.
        path: PathBuf,
        /// How it differs.
        reason: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |error| CheckpointError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// What a checkpoint says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format version it was written in.
    pub format_version: u32,
    /// Version of the burn-offload crate that wrote it.
    pub writer_version: String,
    /// Optimizer updates applied to the parameters.
    pub updates: u64,
    /// The run that wrote it (empty in checkpoints written before runs had
    /// names): a folder holds one run's checkpoints.
    #[serde(default)]
    pub run: String,
    /// Position in the run's write order (1 for its first checkpoint).
    #[serde(default)]
    pub sequence: u64,
    /// Parameter names and shapes per group (stem first).
    pub groups: Vec<Vec<(String, Vec<usize>)>>,
    /// CRC32 of `model.safetensors` and `optimizer.safetensors` (bit rot and
    /// partial writes that keep the header intact are caught on load).
    pub crc32: [u32; 2],
    /// Whatever the trainer needs to continue (config, step, RNG and data
    /// state), opaque to the library.
    pub trainer: serde_json::Value,
}

/// One slab range (f32), or an 8-bit moment's codes (u8) or scales (f32),
/// as a safetensors view (borrowed: no copy).
struct SlabView<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

impl<'a> SlabView<'a> {
    fn f32(shape: &[usize], data: &'a [f32]) -> Self {
        // Little-endian hosts store f32 exactly as safetensors wants it.
        Self {
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            data: bytemuck::cast_slice(data),
        }
    }
}

impl View for SlabView<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn tensor_name(group: usize, slot: &str) -> String {
    if group == 0 {
        format!("stem.{slot}")
    } else {
        format!("blocks.{}.{slot}", group - 1)
    }
}

/// `stem` or `blocks.<i>`: the prefix of a group's tensors.
fn group_name(group: usize) -> String {
    if group == 0 {
        "stem".into()
    } else {
        format!("blocks.{}", group - 1)
    }
}

fn views<'a>(
    store: &'a HostStore,
    prefix: &str,
    slab: impl Fn(usize) -> &'a [f32],
) -> Vec<(String, SlabView<'a>)> {
    let mut out = Vec::new();
    for (g, group) in store.groups.iter().enumerate() {
        let data = slab(g);
        for slot in &group.slots {
            let view = SlabView::f32(&slot.shape, &data[slot.range()]);
            out.push((format!("{prefix}{}", tensor_name(g, &slot.name)), view));
        }
    }
    out
}

/// The optimizer file's tensors: per parameter `m.<name>` and `v.<name>`
/// (f32 moments), or per group `m8.<group>`, `m8.<group>.absmax` and the
/// same for `v8` (8-bit moments: quantisation blocks run across a group's
/// parameters).
fn moment_views(store: &HostStore) -> Vec<(String, SlabView<'_>)> {
    if !store.layout.eight_bit_moments {
        let f32_moment = |g: usize, first: bool| {
            let (m, v) = store.groups[g].moments.f32().expect("f32 moments");
            if first {
                m
            } else {
                v
            }
        };
        let mut all = views(store, "m.", |g| f32_moment(g, true));
        all.extend(views(store, "v.", |g| f32_moment(g, false)));
        return all;
    }
    let mut all = Vec::new();
    for (g, group) in store.groups.iter().enumerate() {
        let Moments::Q8 { m, v } = &group.moments else {
            unreachable!("the layout's moments are 8-bit")
        };
        let name = group_name(g);
        for (prefix, q) in [("m8", m), ("v8", v)] {
            let codes = SlabView {
                dtype: Dtype::U8,
                shape: vec![q.codes.len()],
                data: &q.codes,
            };
            let absmax = SlabView::f32(&[q.absmax.len()], &q.absmax);
            all.push((format!("{prefix}.{name}"), codes));
            all.push((format!("{prefix}.{name}.absmax"), absmax));
        }
    }
    all
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

/// Complete checkpoints under `dir`, by name (step order).
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

/// A checkpoint's folder with its manifest as read.
type Listed = (PathBuf, Result<Manifest, CheckpointError>);

/// Every complete checkpoint under `dir` with its manifest as read.
fn manifests(dir: &Path) -> Result<Vec<Listed>, CheckpointError> {
    Ok(list(dir)?
        .into_iter()
        .map(|path| {
            let manifest = read_manifest(&path);
            (path, manifest)
        })
        .collect())
}

/// The checkpoint `path` points at: itself if it holds a manifest, else the
/// newest written complete checkpoint inside it. One whose manifest cannot be
/// read counts as the newest, so that resuming reports it instead of quietly
/// going back to an older one.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    if path.join(MANIFEST_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    if !path.is_dir() {
        return Err(CheckpointError::NotFound(path.to_path_buf()));
    }
    manifests(path)?
        .into_iter()
        .map(|(path, manifest)| (manifest.map_or(u64::MAX, |m| m.sequence), path))
        .max()
        .map(|(_, path)| path)
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
    load(checkpoint, store, true)
}

/// [`load_into`] of the parameters alone, for a store whose moments are
/// not read (of either kind): a model to generate with. The optimizer file
/// is not opened.
pub fn load_params_into(
    checkpoint: &Path,
    store: &mut HostStore,
) -> Result<Manifest, CheckpointError> {
    load(checkpoint, store, false)
}

fn load(
    checkpoint: &Path,
    store: &mut HostStore,
    moments: bool,
) -> Result<Manifest, CheckpointError> {
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
    let optimizer = match moments {
        true => Some(Mapped::open(&checkpoint.join(OPTIMIZER_FILE))?),
        false => None,
    };
    for (file, want) in std::iter::once(&model)
        .chain(optimizer.as_ref())
        .zip(manifest.crc32)
    {
        let got = file.crc32();
        if got != want {
            let reason = format!("checksum {got:08x} differs from the manifest's {want:08x}");
            return Err(CheckpointError::Corrupt {
                path: file.path.clone(),
                reason,
            });
        }
    }
    let model_st = model.parse()?;
    // Validate every tensor first.
    for (g, group) in store.groups.iter().enumerate() {
        for slot in &group.slots {
            let name = tensor_name(g, &slot.name);
            model.check(&model_st, &name, Dtype::F32, &slot.shape)?;
        }
    }
    let optim_st = match &optimizer {
        Some(optimizer) => Some((optimizer, check_moments(checkpoint, optimizer, store)?)),
        None => None,
    };
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
            if let (Some((_, optim_st)), Moments::F32 { m, v }) = (&optim_st, &mut group.moments) {
                for (prefix, out) in [("m", m), ("v", v)] {
                    let tensor = optim_st
                        .tensor(&format!("{prefix}.{name}"))
                        .expect("checked");
                    copy_f32(tensor.data(), &mut out.as_mut_slice()[range.clone()]);
                }
            }
        }
        if let (Some((_, optim_st)), Moments::Q8 { m, v }) = (&optim_st, &mut group.moments) {
            let name = group_name(g);
            for (prefix, q) in [("m8", m), ("v8", v)] {
                let codes = optim_st
                    .tensor(&format!("{prefix}.{name}"))
                    .expect("checked");
                q.codes.copy_from_slice(codes.data());
                let absmax = optim_st
                    .tensor(&format!("{prefix}.{name}.absmax"))
                    .expect("checked");
                copy_f32(absmax.data(), &mut q.absmax);
            }
        }
    }
    Ok(manifest)
}

/// The optimizer file parsed, once every moment `store` keeps is checked
/// in it: of the store's kind (8-bit codes are not f32 values), present,
/// with its shape.
fn check_moments<'a>(
    checkpoint: &Path,
    optimizer: &'a Mapped,
    store: &HostStore,
) -> Result<SafeTensors<'a>, CheckpointError> {
    let optim_st = optimizer.parse()?;
    let eight_bit = store.layout.eight_bit_moments;
    if optim_st.tensor("m8.stem").is_ok() != eight_bit {
        let kind = |q: bool| if q { "8-bit" } else { "fp32" };
        return Err(CheckpointError::Mismatch {
            path: checkpoint.to_path_buf(),
            reason: format!(
                "it holds {} optimizer state, the run keeps {} (--optim-state)",
                kind(!eight_bit),
                kind(eight_bit)
            ),
        });
    }
    for (g, group) in store.groups.iter().enumerate() {
        if !eight_bit {
            for slot in &group.slots {
                let name = tensor_name(g, &slot.name);
                optimizer.check(&optim_st, &format!("m.{name}"), Dtype::F32, &slot.shape)?;
                optimizer.check(&optim_st, &format!("v.{name}"), Dtype::F32, &slot.shape)?;
            }
        }
        if let Moments::Q8 { m, .. } = &group.moments {
            let name = group_name(g);
            for prefix in ["m8", "v8"] {
                let (codes, blocks) = (m.codes.len(), m.absmax.len());
                optimizer.check(&optim_st, &format!("{prefix}.{name}"), Dtype::U8, &[codes])?;
                let absmax = format!("{prefix}.{name}.absmax");
                optimizer.check(&optim_st, &absmax, Dtype::F32, &[blocks])?;
            }
        }
    }
    Ok(optim_st)
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
        dtype: Dtype,
        shape: &[usize],
    ) -> Result<(), CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt {
            path: self.path.clone(),
            reason,
        };
        let t = st
            .tensor(name)
            .map_err(|_| corrupt(format!("tensor `{name}` is missing")))?;
        if t.dtype() != dtype || t.shape() != shape {
            return Err(corrupt(format!(
                "tensor `{name}` is {:?} {:?}, expected {dtype:?} {shape:?}",
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
