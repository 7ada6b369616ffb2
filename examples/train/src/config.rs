//! Options in a file: `--config FILE` and the `config.toml` a run writes
//! beside its checkpoints, which `--resume` reads back.
//!
//! The file is TOML (the Rust ecosystem's configuration format, with
//! comments and without indentation that changes the meaning), and its keys
//! are the long names of [`TrainOptions`]' flags (`seq-len = 4096`,
//! `lr = 2e-5`, `fused = true`, `adam-betas = [0.9, 0.95]`), so each flag's
//! `--help` documents its key. A file becomes flags: its keys go before the
//! command line's, and a key that a later layer gives is dropped (the
//! later value replaces it whole); every value goes through the very
//! parser of its flag. The layers, later ones overriding:
//! the `config.toml` of `--resume`'s folder, the `--config` file, the
//! command line.

use std::any::TypeId;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, ArgMatches, Args, Command};

use crate::options::{GivenFlags, TrainOptions};

/// The name of the resolved options a run writes into `--checkpoint-dir`.
pub const SAVED: &str = "config.toml";

/// Keys of a run's own invocation, left out of the `config.toml` it
/// writes: a resume names its checkpoint itself, and a `--stop-after`
/// would stop the resume at once.
const NOT_SAVED: [&str; 2] = ["resume", "stop-after"];

/// Why a configuration file cannot be read or written; each names the file
/// (`--config`'s, or the `config.toml` of `--resume`) and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{flag} `{}`: cannot read: {error}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{flag} `{}`: not TOML (line {line}): {message}", path.display())]
    Syntax {
        flag: &'static str,
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "{flag} `{}`: unknown key `{key}` (the keys are train's flags' long names, e.g. `seq-len`)",
        path.display()
    )]
    UnknownKey {
        flag: &'static str,
        path: PathBuf,
        key: String,
    },
    #[error("{flag} `{}`: key `{key}` takes {expected}, not {found}", path.display())]
    Type {
        flag: &'static str,
        path: PathBuf,
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{flag} `{}`: key `{key}`: {message}", path.display())]
    Value {
        flag: &'static str,
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error("--checkpoint-dir: cannot write `{}`: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// The TOML type a flag's key takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A switch: `true` gives the flag (`no-packing = true` is `--no-packing`).
    Switch,
    Integer,
    /// A number; an integer is taken as well (`grad-clip = 1`).
    Float,
    /// An array of numbers (`adam-betas = [0.9, 0.95]`).
    Floats,
    /// A string: a name or a path.
    Text,
}

impl Kind {
    fn of(arg: &Arg) -> Self {
        if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
            return Kind::Switch;
        }
        let ty = arg.get_value_parser().type_id();
        let is = |id: TypeId| ty == id;
        if [TypeId::of::<usize>(), TypeId::of::<u64>()]
            .into_iter()
            .any(is)
        {
            Kind::Integer
        } else if [TypeId::of::<f64>(), TypeId::of::<f32>()]
            .into_iter()
            .any(is)
        {
            match arg.get_value_delimiter() {
                Some(_) => Kind::Floats,
                None => Kind::Float,
            }
        } else {
            Kind::Text
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Switch => "a boolean (true or false)",
            Kind::Integer => "an integer",
            Kind::Float => "a number",
            Kind::Floats => "an array of numbers",
            Kind::Text => "a string",
        }
    }
}

fn type_name(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

/// [`TrainOptions`]' flags, as clap builds them.
fn command() -> Command {
    TrainOptions::augment_args(Command::new("train").allow_negative_numbers(true))
}

/// The flag whose long name is `key`.
fn flag(command: &Command, key: &str) -> Option<Arg> {
    command
        .get_arguments()
        .find(|arg| arg.get_long() == Some(key))
        .cloned()
}

/// A configuration file's options, as flags.
#[derive(Debug, Clone, Default)]
pub struct FileArgs {
    /// Each key's clap id (`packing` for `no-packing`) and flags
    /// (`--key value`), in the file's order.
    keys: Vec<(String, Vec<OsString>)>,
}

impl FileArgs {
    /// The clap ids of the flags the file gives, for
    /// [`crate::options::GivenFlags`].
    pub fn ids(&self) -> impl Iterator<Item = String> + '_ {
        self.keys.iter().map(|(id, _)| id.clone())
    }

    /// The file's flags but those a later layer gives (`overridden`, by
    /// clap id): it replaces them whole (an array too, which clap would
    /// append to).
    pub fn args_but(&self, overridden: &GivenFlags) -> Vec<OsString> {
        self.keys
            .iter()
            .filter(|(id, _)| !overridden.contains(id))
            .flat_map(|(_, words)| words.iter().cloned())
            .collect()
    }
}

/// Reads `path` (`flag` names it in errors: `--config` or `--resume`) and
/// turns its keys into flags, each checked: a key that is no flag, a value
/// of the wrong TOML type or one its flag refuses is an error naming it.
pub fn read(flag_name: &'static str, path: &Path) -> Result<FileArgs, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        flag: flag_name,
        path: path.to_path_buf(),
        error,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|err| ConfigError::Syntax {
        flag: flag_name,
        path: path.to_path_buf(),
        line: err
            .span()
            .map_or(1, |span| text[..span.start].matches('\n').count() + 1),
        message: err.message().trim().to_string(),
    })?;
    let command = command();
    let mut file = FileArgs::default();
    for (key, value) in &table {
        let Some(arg) = flag(&command, key) else {
            return Err(ConfigError::UnknownKey {
                flag: flag_name,
                path: path.to_path_buf(),
                key: key.clone(),
            });
        };
        let kind = Kind::of(&arg);
        let wrong = || ConfigError::Type {
            flag: flag_name,
            path: path.to_path_buf(),
            key: key.clone(),
            expected: kind.name(),
            found: type_name(value),
        };
        let words: Vec<String> = match (kind, value) {
            (Kind::Switch, toml::Value::Boolean(on)) => match on {
                true => vec![format!("--{key}")],
                false => Vec::new(),
            },
            (Kind::Integer, toml::Value::Integer(n)) => vec![format!("--{key}"), n.to_string()],
            // What TOML's integers (i64) cannot hold, as `resolved` writes it.
            (Kind::Integer, toml::Value::String(s)) if beyond_i64(s) => {
                vec![format!("--{key}"), s.clone()]
            }
            (Kind::Float, toml::Value::Integer(n)) => vec![format!("--{key}"), n.to_string()],
            (Kind::Float, toml::Value::Float(x)) => vec![format!("--{key}"), x.to_string()],
            (Kind::Floats, toml::Value::Array(items)) => {
                let numbers = items
                    .iter()
                    .map(|item| match item {
                        toml::Value::Float(x) => Some(x.to_string()),
                        toml::Value::Integer(n) => Some(n.to_string()),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| ConfigError::Type {
                        flag: flag_name,
                        path: path.to_path_buf(),
                        key: key.clone(),
                        expected: kind.name(),
                        found: "an array holding other values",
                    })?;
                vec![format!("--{key}"), numbers.join(",")]
            }
            (Kind::Text, toml::Value::String(s)) => vec![format!("--{key}"), s.clone()],
            _ => return Err(wrong()),
        };
        // The flag's own parser, alone, so that its refusal names this key.
        if let Err(err) = command
            .clone()
            .try_get_matches_from(std::iter::once("train".to_string()).chain(words.clone()))
        {
            let text = err.to_string();
            let first = text.lines().next().unwrap_or_default();
            return Err(ConfigError::Value {
                flag: flag_name,
                path: path.to_path_buf(),
                key: key.clone(),
                message: first.trim_start_matches("error: ").to_string(),
            });
        }
        file.keys.push((
            arg.get_id().as_str().to_string(),
            words.into_iter().map(OsString::from).collect(),
        ));
    }
    Ok(file)
}

/// Whether `s` is a u64 beyond TOML's integers (a `--seed` above 2^63),
/// which [`resolved`] writes as a string.
fn beyond_i64(s: &str) -> bool {
    s.parse::<u64>().is_ok_and(|n| i64::try_from(n).is_err())
}

/// The `config.toml` beside `--resume`'s checkpoint: in the folder itself
/// (a `--checkpoint-dir`) or in the one above (a `step-<N>` folder);
/// `None` where there is none (checkpoints written before it was saved).
pub fn saved_beside(resume: &Path) -> Option<PathBuf> {
    [Some(resume), resume.parent()]
        .into_iter()
        .flatten()
        .map(|dir| dir.join(SAVED))
        .find(|path| path.is_file())
}

/// The options `matches` resolved (every flag's value, defaults included,
/// but those of [`NOT_SAVED`]), as the TOML of a `config.toml`; paths are
/// made absolute so that a resume reads them from any folder.
pub fn resolved(matches: &ArgMatches) -> String {
    let mut table = toml::Table::new();
    for arg in command().get_arguments() {
        let (Some(key), id) = (arg.get_long(), arg.get_id().as_str()) else {
            continue;
        };
        if NOT_SAVED.contains(&key) {
            continue;
        }
        let kind = Kind::of(arg);
        if kind == Kind::Switch {
            let set = matches.get_flag(id);
            let given = match arg.get_action() {
                ArgAction::SetFalse => !set,
                _ => set,
            };
            table.insert(key.to_string(), toml::Value::Boolean(given));
            continue;
        }
        let Some(raw) = matches.get_raw(id) else {
            continue;
        };
        let raw: Vec<String> = raw.map(|v| v.to_string_lossy().into_owned()).collect();
        let number = |s: &String| s.parse::<f64>().ok().map(toml::Value::Float);
        let value = match kind {
            Kind::Integer => raw[0]
                .parse::<i64>()
                .ok()
                .map(toml::Value::Integer)
                .unwrap_or_else(|| toml::Value::String(raw[0].clone())),
            Kind::Float => number(&raw[0]).unwrap_or_else(|| toml::Value::String(raw[0].clone())),
            Kind::Floats => toml::Value::Array(
                raw.iter()
                    .flat_map(|s| s.split(','))
                    .filter_map(|s| number(&s.to_string()))
                    .collect(),
            ),
            Kind::Switch | Kind::Text => toml::Value::String(absolute(arg, &raw[0])),
        };
        table.insert(key.to_string(), value);
    }
    format!(
        "# The options this run resolved (its flags, its --config file and the defaults),\n\
         # written by `train`; `train --resume` in this folder reads them.\n{}",
        toml::to_string(&table).unwrap_or_default()
    )
}

/// `value` as an absolute path where it names a path: every value of a
/// path flag, and a name-or-path one (`--model`, `--tokenizer`) that is an
/// existing file or folder written as a path.
fn absolute(arg: &Arg, value: &str) -> String {
    let path = Path::new(value);
    let is_path = arg.get_value_parser().type_id() == TypeId::of::<PathBuf>()
        || ((value.contains('/') || value.contains('.')) && path.exists());
    match std::path::absolute(path) {
        Ok(abs) if is_path => abs.to_string_lossy().into_owned(),
        _ => value.to_string(),
    }
}

/// Writes `text` as `dir`'s `config.toml`, whole or not at all (a
/// temporary file renamed over it).
pub fn write(dir: &Path, text: &str) -> Result<(), ConfigError> {
    let path = dir.join(SAVED);
    let tmp = dir.join(format!("{SAVED}.tmp"));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|error| ConfigError::Write { path, error })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag of [`TrainOptions`] is a key of one of the TOML types
    /// (paths and enums are strings).
    #[test]
    fn every_flag_has_a_key_and_a_type() {
        let command = command();
        let kind = |key: &str| Kind::of(&flag(&command, key).unwrap());
        assert_eq!(kind("seq-len"), Kind::Integer);
        assert_eq!(kind("seed"), Kind::Integer);
        assert_eq!(kind("lr"), Kind::Float);
        assert_eq!(kind("adam-eps"), Kind::Float);
        assert_eq!(kind("adam-betas"), Kind::Floats);
        assert_eq!(kind("no-packing"), Kind::Switch);
        assert_eq!(kind("fused"), Kind::Switch);
        assert_eq!(kind("compute"), Kind::Text);
        assert_eq!(kind("keep-graphs"), Kind::Text);
        assert!(command.get_arguments().all(|arg| arg.get_long().is_some()));
    }

    /// What `resolved` writes, `read` takes back as the same flags: a seed
    /// beyond TOML's integers too (a string).
    #[test]
    fn resolved_options_read_back() {
        let matches = command()
            .try_get_matches_from(["train", "--seed", "18446744073709551615", "--lr", "3e-4"])
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &resolved(&matches)).unwrap();
        let file = read("--resume", &dir.path().join(SAVED)).unwrap();
        let again = command()
            .try_get_matches_from(
                std::iter::once(OsString::from("train"))
                    .chain(file.args_but(&GivenFlags::default())),
            )
            .unwrap();
        assert_eq!(again.get_one::<u64>("seed"), Some(&u64::MAX));
        assert_eq!(again.get_one::<f64>("lr"), Some(&3e-4));
        assert_eq!(resolved(&again), resolved(&matches));
    }
}
