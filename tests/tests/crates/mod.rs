//! The workspace's crates and their module trees, for `workspace_rules.rs`:
//! the members read from the root Cargo.toml (plus any crate under
//! `examples/`), each crate's library, programs and tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::reader::rust_files;

/// The workspace's root folder (this crate sits in `tests/`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// The text of `path`; a file that cannot be read fails the test.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The value text of `key` in `[table]` of a Cargo.toml (`#` comments
/// dropped; an array may span lines).
pub fn toml_value(text: &str, table: &str, key: &str) -> Option<String> {
    let mut current = String::new();
    let mut lines = text.lines().map(|line| {
        let mut in_string = false;
        let end = line
            .char_indices()
            .find(|(_, c)| {
                in_string ^= *c == '"';
                *c == '#' && !in_string
            })
            .map_or(line.len(), |(i, _)| i);
        line[..end].trim().to_string()
    });
    while let Some(line) = lines.next() {
        if line.starts_with('[') && !line.starts_with("[\"") {
            current = line.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let Some((k, value)) = line.split_once('=') else {
            continue;
        };
        if current != table || k.trim() != key {
            continue;
        }
        let mut value = value.trim().to_string();
        while value.matches('[').count() > value.matches(']').count() {
            let Some(more) = lines.next() else { break };
            value.push(' ');
            value.push_str(&more);
        }
        return Some(value);
    }
    None
}

/// The quoted strings of a TOML value (`["a", "b"]` or `"a"`).
pub fn toml_strings(value: &str) -> Vec<String> {
    value
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The workspace's crates, as folders relative to the root: the members
/// (a `*` in the last part expands to the folders it matches), plus every
/// crate under `examples/`.
pub fn crates() -> Vec<String> {
    let manifest = read(&root().join("Cargo.toml"));
    let members = toml_value(&manifest, "workspace", "members").expect("[workspace] members");
    let mut crates = BTreeSet::new();
    let mut patterns = toml_strings(&members);
    patterns.push("examples/*".to_string());
    for pattern in patterns {
        let (parent, last) = pattern.rsplit_once('/').unwrap_or(("", pattern.as_str()));
        let Some((before, after)) = last.split_once('*') else {
            crates.insert(pattern.clone());
            continue;
        };
        let Ok(entries) = std::fs::read_dir(root().join(parent)) else {
            continue;
        };
        for entry in entries {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .to_string();
            let dir = if parent.is_empty() {
                name.clone()
            } else {
                format!("{parent}/{name}")
            };
            if name.starts_with(before)
                && name.ends_with(after)
                && root().join(&dir).join("Cargo.toml").is_file()
            {
                crates.insert(dir);
            }
        }
    }
    crates.into_iter().collect()
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Kind {
    /// The `[lib]` target's module tree.
    Library,
    /// A binary, bench or example: not tests, not a library.
    Program,
    /// The crate's `tests/` folder.
    Test,
}

/// One module tree: its folder (workspace-relative), its root files (each
/// the module `[]`: `lib.rs`, `main.rs`, or every file of a `tests/`
/// folder) and its files with their text, relative to the folder.
pub struct Unit {
    pub dir: String,
    pub kind: Kind,
    pub roots: Vec<String>,
    pub files: Vec<(String, String)>,
}

impl Unit {
    fn read(krate: &str, dir: &str, kind: Kind, roots: Vec<String>, skip: &[&str]) -> Unit {
        let base = root().join(krate).join(dir);
        let mut paths = Vec::new();
        rust_files(&base, &base, skip, &mut paths);
        Unit::of(krate, dir, kind, roots, paths)
    }

    fn of(krate: &str, dir: &str, kind: Kind, roots: Vec<String>, paths: Vec<String>) -> Unit {
        let base = root().join(krate).join(dir);
        let files = paths
            .into_iter()
            .map(|p| {
                let text = read(&base.join(&p));
                (p, text)
            })
            .collect();
        Unit {
            dir: format!("{krate}/{dir}"),
            kind,
            roots,
            files,
        }
    }
}

/// Every module tree of the crate in `krate`: the library (`[lib] path` or
/// `src/lib.rs`), `src/main.rs`, each of `src/bin/`, and the `tests/`,
/// `benches/` and `examples/` folders.
pub fn units(krate: &str) -> Vec<Unit> {
    let base = root().join(krate);
    let manifest = read(&base.join("Cargo.toml"));
    let lib = toml_value(&manifest, "lib", "path")
        .and_then(|v| toml_strings(&v).pop())
        .unwrap_or_else(|| "src/lib.rs".to_string());
    let mut units = Vec::new();
    let has_lib = base.join(&lib).is_file();
    if has_lib {
        let (dir, file) = lib.rsplit_once('/').unwrap_or((".", &lib));
        let roots = vec![file.to_string()];
        units.push(Unit::read(
            krate,
            dir,
            Kind::Library,
            roots,
            &["bin", "main.rs"],
        ));
    }
    if base.join("src/main.rs").is_file() {
        let roots = vec!["main.rs".to_string()];
        units.push(if has_lib {
            Unit::of(krate, "src", Kind::Program, roots.clone(), roots)
        } else {
            Unit::read(krate, "src", Kind::Program, roots, &["bin"])
        });
    }
    for (folder, kind) in [
        ("src/bin", Kind::Program),
        ("tests", Kind::Test),
        ("benches", Kind::Program),
        ("examples", Kind::Program),
    ] {
        let Ok(entries) = std::fs::read_dir(base.join(folder)) else {
            continue;
        };
        // A folder with a main.rs is a target of its own; the other files
        // of `folder` share one unit, each top-level file a root.
        let (mut own, mut skip) = (Vec::new(), Vec::new());
        for entry in entries {
            let path = entry.expect("entry").path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.join("main.rs").is_file() {
                own.push(name.clone());
                skip.push(name);
            }
        }
        own.sort();
        for name in own {
            let dir = format!("{folder}/{name}");
            units.push(Unit::read(krate, &dir, kind, vec!["main.rs".into()], &[]));
        }
        let skip: Vec<&str> = skip.iter().map(String::as_str).collect();
        let mut unit = Unit::read(krate, folder, kind, Vec::new(), &skip);
        unit.roots = unit
            .files
            .iter()
            .map(|(p, _)| p.clone())
            .filter(|p| !p.contains('/'))
            .collect();
        units.push(unit);
    }
    units
}
