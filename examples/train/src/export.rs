//! `--export-hf`: the trained model as a whole Hugging Face folder —
//! `config.json` with the special tokens' ids, `generation_config.json`,
//! `model.safetensors` and the tokenizer's files — that never replaces a
//! folder the user did not give up.
//!
//! [`check`] refuses, before the first step, a folder that holds files or
//! lies in (or around) one the run reads or writes, unless `--overwrite`;
//! [`write`] fills a folder beside the destination and renames it into place,
//! so a failed export leaves whatever was there before. `--export-peft`'s
//! folder obeys the same rules (each error names the flag it is about).

use std::fs;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use crate::options::TrainOptions;
use crate::tokenizer::Tokenizer;

/// The whole model's export flag.
pub const HF: &str = "--export-hf";
/// The adapters' export flag.
pub const PEFT: &str = "--export-peft";

/// Why an export folder is refused or could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{to} `{}` is a file, not a folder", export.display())]
    IsAFile { to: &'static str, export: PathBuf },
    #[error(
        "{to} `{}` {} {of} folder{}: the export would overwrite {what}; choose another \
         folder, or add --overwrite to replace it",
        export.display(),
        if *inside { "is inside the" } else { "is the" },
        if *inside { format!(" `{}`", folder.display()) } else { String::new() }
    )]
    InSource {
        to: &'static str,
        export: PathBuf,
        of: &'static str,
        folder: PathBuf,
        inside: bool,
        what: &'static str,
    },
    #[error(
        "{to} `{}` is the --checkpoint-dir folder: the export would replace this run's \
         checkpoints; choose another folder",
        export.display()
    )]
    IsCheckpointDir { to: &'static str, export: PathBuf },
    #[error(
        "{to} `{}` holds the {of} folder `{}`: replacing it would delete that; choose \
         another folder",
        export.display(),
        folder.display()
    )]
    HoldsSource {
        to: &'static str,
        export: PathBuf,
        of: &'static str,
        folder: PathBuf,
    },
    #[error(
        "{to} `{}` already holds files ({names}); choose a new or empty folder, or add \
         --overwrite to replace it",
        export.display()
    )]
    NotEmpty {
        to: &'static str,
        export: PathBuf,
        names: String,
    },
    #[error("{to} `{}`: `{}` is a file, not a folder", export.display(), file.display())]
    UnderAFile {
        to: &'static str,
        export: PathBuf,
        file: PathBuf,
    },
    #[error(
        "{to} `{}`: cannot write into `{}`: {error}",
        export.display(),
        folder.display()
    )]
    NotWritable {
        to: &'static str,
        export: PathBuf,
        folder: PathBuf,
        error: std::io::Error,
    },
    #[error("{to} `{}`: {error}", path.display())]
    Io {
        to: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{to}: cannot copy `{}`: {error}", file.display())]
    Copy {
        to: &'static str,
        file: PathBuf,
        error: std::io::Error,
    },
    /// The weights could not be written: the writer's own words.
    #[error(transparent)]
    Weights(#[from] models::hf::HfError),
    /// The adapters could not be written: the writer's own words.
    #[error(transparent)]
    Adapters(#[from] models::peft::PeftError),
}

fn io<'a>(to: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ExportError + 'a {
    move |error| ExportError::Io {
        to,
        path: path.to_path_buf(),
        error,
    }
}

/// A folder the run reads or writes, which the export must not replace
/// unasked: `--init-from`, `--resume`, `--checkpoint-dir`.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub flag: &'static str,
    pub path: &'a Path,
}

/// The folders a run reads or writes, which no export may replace unasked:
/// `--init-from`, `--resume`, `--checkpoint-dir` (those given).
pub fn run_folders(opts: &TrainOptions) -> Vec<Source<'_>> {
    [
        ("--init-from", &opts.init_from),
        ("--resume", &opts.resume),
        ("--checkpoint-dir", &opts.checkpoint_dir),
    ]
    .into_iter()
    .filter_map(|(flag, path)| path.as_deref().map(|path| Source { flag, path }))
    .collect()
}

/// Refuses `export` when it is a file, is the checkpoint folder, holds one of
/// `sources`, or — unless `overwrite` — is or lies inside one of them, or
/// already holds files. Nothing is created. `to` names the export's flag.
pub fn check(
    to: &'static str,
    export: &Path,
    overwrite: bool,
    sources: &[Source<'_>],
) -> Result<(), ExportError> {
    if export.exists() && !export.is_dir() {
        return Err(ExportError::IsAFile {
            to,
            export: export.to_path_buf(),
        });
    }
    let target = absolute(export);
    for source in sources {
        let place = absolute(source.path);
        if target == place && source.flag == "--checkpoint-dir" {
            return Err(ExportError::IsCheckpointDir {
                to,
                export: export.to_path_buf(),
            });
        }
        if place.starts_with(&target) && place != target {
            return Err(ExportError::HoldsSource {
                to,
                export: export.to_path_buf(),
                of: source.flag,
                folder: source.path.to_path_buf(),
            });
        }
        if target.starts_with(&place) && !overwrite {
            return Err(ExportError::InSource {
                to,
                export: export.to_path_buf(),
                of: source.flag,
                folder: source.path.to_path_buf(),
                inside: target != place,
                what: match source.flag {
                    "--init-from" => "the checkpoint this run starts from",
                    "--resume" => "the checkpoint this run resumes from",
                    _ => "the folder of this run's checkpoints",
                },
            });
        }
    }
    check_writable_parent(to, export)?;
    if !overwrite && export.is_dir() {
        let mut names: Vec<String> = fs::read_dir(export)
            .map_err(io(to, export))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        if !names.is_empty() {
            names.sort();
            let shown = names.len().min(3);
            let mut list = names[..shown].join(", ");
            if names.len() > shown {
                list.push_str(&format!(" and {} more", names.len() - shown));
            }
            return Err(ExportError::NotEmpty {
                to,
                export: export.to_path_buf(),
                names: list,
            });
        }
    }
    Ok(())
}

/// Checks that the folder the export is written beside (`export`'s parent,
/// or the nearest existing folder above it) takes files, leaving nothing.
fn check_writable_parent(to: &'static str, export: &Path) -> Result<(), ExportError> {
    let mut existing = parent_folder(export);
    while !existing.exists() {
        existing = parent_folder(existing);
    }
    if !existing.is_dir() {
        return Err(ExportError::UnderAFile {
            to,
            export: export.to_path_buf(),
            file: existing.to_path_buf(),
        });
    }
    let probe = existing.join(format!(".burn-offload-probe-{}", std::process::id()));
    let written = fs::File::create(&probe).and_then(|mut f| f.write_all(b"probe"));
    let _ = fs::remove_file(&probe);
    written.map_err(|error| ExportError::NotWritable {
        to,
        export: export.to_path_buf(),
        folder: existing.to_path_buf(),
        error,
    })
}

/// The folder `path` lies in (`.` for a bare name).
fn parent_folder(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// `path` made absolute, with `..` and symbolic links resolved as far as the
/// path exists (the rest appended as written).
fn absolute(path: &Path) -> PathBuf {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = path.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            let mut out = real;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return normalized(&out);
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return normalized(&path),
        }
    }
}

/// `path` without `.` components and with `..` applied.
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Writes the export at `dir`: `fill` writes the folder's files into a
/// folder beside `dir`, which then takes `dir`'s place (an existing `dir` is
/// removed only once the new one is complete; [`check`] has decided that it
/// may be). `to` names the export's flag.
pub fn write(
    to: &'static str,
    dir: &Path,
    fill: impl FnOnce(&Path) -> Result<(), ExportError>,
) -> Result<(), ExportError> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "export".into());
    let parent = parent_folder(dir);
    fs::create_dir_all(parent).map_err(io(to, parent))?;
    let pid = std::process::id();
    let staging = parent.join(format!(".{name}.export-{pid}"));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir(&staging).map_err(io(to, &staging))?;
    if let Err(err) = fill(&staging).and_then(|()| sync_folder(to, &staging)) {
        let _ = fs::remove_dir_all(&staging);
        return Err(err);
    }
    let old = parent.join(format!(".{name}.replaced-{pid}"));
    let replacing = dir.exists();
    if replacing {
        fs::rename(dir, &old).map_err(io(to, dir))?;
    }
    if let Err(error) = fs::rename(&staging, dir) {
        if replacing {
            let _ = fs::rename(&old, dir);
        }
        let _ = fs::remove_dir_all(&staging);
        return Err(ExportError::Io {
            to,
            path: dir.to_path_buf(),
            error,
        });
    }
    if replacing {
        fs::remove_dir_all(&old).map_err(io(to, &old))?;
    }
    Ok(())
}

/// Flushes every file of `dir` to disk, then the folder itself.
fn sync_folder(to: &'static str, dir: &Path) -> Result<(), ExportError> {
    for entry in fs::read_dir(dir).map_err(io(to, dir))? {
        let path = entry.map_err(io(to, dir))?.path();
        fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(io(to, &path))?;
    }
    fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io(to, dir))?;
    Ok(())
}

/// The special tokens' ids `config.json` carries: the source checkpoint's
/// (`--init-from`'s `config.json`) where it names them, else the
/// tokenizer's.
pub fn special_token_ids(source: Option<&Value>, tokenizer: &Tokenizer) -> Map<String, Value> {
    let specials = tokenizer.specials();
    let mut ids = Map::new();
    for (key, ours) in [
        ("bos_token_id", &specials.bos),
        ("eos_token_id", &specials.eos),
        ("pad_token_id", &specials.pad),
    ] {
        match source.and_then(|c| c.get(key)) {
            Some(value) => {
                ids.insert(key.into(), value.clone());
            }
            None => {
                if let Some(special) = ours {
                    ids.insert(key.into(), special.id.into());
                }
            }
        }
    }
    ids
}

/// Writes `config.json` (`model_config` with `ids`) and
/// `generation_config.json` into `dir`: the source checkpoint's
/// `generation_config.json` where `init_from` has one, else the ids.
pub fn write_configs(
    dir: &Path,
    mut model_config: Value,
    ids: &Map<String, Value>,
    init_from: Option<&Path>,
) -> Result<(), ExportError> {
    if let Some(fields) = model_config.as_object_mut() {
        fields.extend(ids.clone());
    }
    let path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&model_config).expect("a config serialises");
    fs::write(&path, text).map_err(io(HF, &path))?;
    let path = dir.join("generation_config.json");
    match init_from
        .map(|d| d.join("generation_config.json"))
        .filter(|p| p.is_file())
    {
        Some(source) => {
            fs::copy(&source, &path).map_err(io(HF, &source))?;
        }
        None => {
            let known: Map<String, Value> = ids
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !known.is_empty() {
                let text =
                    serde_json::to_string_pretty(&Value::Object(known)).expect("ids serialise");
                fs::write(&path, text).map_err(io(HF, &path))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_compare_after_dots_and_links_are_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("ck");
        fs::create_dir(&ck).unwrap();
        let sources = [Source {
            flag: "--init-from",
            path: &ck,
        }];
        let dotted = dir.path().join("ck/../ck/./");
        let err = check(HF, &dotted, false, &sources).unwrap_err().to_string();
        assert!(err.contains("is the --init-from folder"), "{err}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&ck, &link).unwrap();
        let err = check(HF, &link.join("new"), false, &sources)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is inside the --init-from folder"), "{err}");
        assert!(check(HF, &link.join("new"), true, &sources).is_ok());
        let err = check(HF, dir.path(), true, &sources)
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds the --init-from folder"), "{err}");
        assert!(check(HF, &dir.path().join("elsewhere"), false, &sources).is_ok());
    }
}
