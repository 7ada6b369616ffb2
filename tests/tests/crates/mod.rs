//! The workspace's crates and their module trees, for `workspace_rules.rs`:
//! the members read from the root Cargo.toml (plus any crate under
//! `examples/`), each crate's library, programs and tests, and which code
//! is test code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::reader::{code_only, module_of, rust_files};

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

    /// The files that are not test code: the whole unit unless it is a
    /// `tests/` folder, less the modules declared `#[cfg(test)] mod x;`.
    /// Paths are workspace-relative.
    pub fn non_test_files(&self) -> Vec<(String, String)> {
        if self.kind == Kind::Test {
            return Vec::new();
        }
        let mut test_modules = Vec::new();
        for (path, text) in &self.files {
            for name in strip_test_code(&code_only(text)).1 {
                let mut module = self.module(path);
                module.push(name);
                test_modules.push(module);
            }
        }
        self.files
            .iter()
            .filter(|(path, _)| {
                let module = self.module(path);
                !test_modules.iter().any(|t| module.starts_with(t))
            })
            .map(|(path, text)| (format!("{}/{path}", self.dir), text.clone()))
            .collect()
    }

    fn module(&self, path: &str) -> Vec<String> {
        if self.roots.iter().any(|r| r == path) {
            Vec::new()
        } else {
            module_of(path)
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

/// `code` (from `code_only`) with every `#[cfg(test)]` item blanked (its
/// newlines kept), and the names of the modules declared `#[cfg(test)] mod
/// name;`, whose files are test code.
pub fn strip_test_code(code: &str) -> (String, Vec<String>) {
    const ATTRIBUTE: &str = "#[cfg(test)]";
    let (mut out, mut modules, mut at) = (String::new(), Vec::new(), 0);
    while let Some(i) = code[at..].find(ATTRIBUTE) {
        let start = at + i;
        out.push_str(&code[at..start]);
        // The item ends at its first `;` or its first block's `}`.
        let (mut depth, mut end, mut block) = (0i32, code.len(), false);
        for (j, c) in code[start + ATTRIBUTE.len()..].char_indices() {
            let j = start + ATTRIBUTE.len() + j;
            match c {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                '{' => {
                    depth += 1;
                    block = true;
                }
                '}' => depth -= 1,
                ';' if depth == 0 && !block => {
                    end = j + 1;
                    break;
                }
                _ => {}
            }
            if block && depth == 0 {
                end = j + 1;
                break;
            }
        }
        let item = &code[start..end];
        if !block {
            let words: Vec<&str> = item
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .collect();
            if let Some(m) = words.iter().position(|w| *w == "mod") {
                if let Some(name) = words[m + 1..].iter().find(|w| !w.is_empty()) {
                    modules.push(name.to_string());
                }
            }
        }
        out.extend(item.chars().filter(|c| *c == '\n'));
        at = end;
    }
    out.push_str(&code[at..]);
    (out, modules)
}
