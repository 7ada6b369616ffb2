//! The shape of `burn-offload/src`: its top-level modules are layers, each
//! using only the layers before it (so no two modules import each other, in
//! a circle or otherwise), the files inside each folder import each other
//! without cycles, and no file grows past 800 lines.
//!
//! A small reader of `use` paths rather than a tool: it sees every
//! `crate::…`, `$crate::…` and `super::…` path in the sources, comments
//! and strings aside, which is how this crate refers to its own modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, first to last: a module may use its own layer and earlier ones.
const LAYERS: &[&[&str]] = &[
    &["host"],
    &["store"],
    &["transfer"],
    &["backend"],
    &["cuda"],
    &["precision", "matmul", "model", "device", "documents"],
    &["ops"],
    &["engine"],
];

const MAX_LINES: usize = 800;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../burn-offload/src")
}

/// Every `.rs` file under `dir`, with its module path (`["engine", "head"]`;
/// `mod.rs` is its folder's module, `lib.rs` the root `[]`).
fn sources(dir: &Path, module: &[String], out: &mut Vec<(Vec<String>, PathBuf)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            let mut inner = module.to_vec();
            inner.push(name);
            sources(&path, &inner, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let mut m = module.to_vec();
            if name != "mod" && name != "lib" {
                m.push(name);
            }
            out.push((m, path));
        }
    }
}

/// `text` without comments and string literals (so docs naming a path do
/// not count as uses).
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            // A char literal such as '"' or '{' (not a lifetime).
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if rest.chars().nth(1) == Some('\'') {
                    chars.nth(1);
                } else if rest.starts_with('\\') && rest.chars().nth(2) == Some('\'') {
                    chars.nth(2);
                }
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// The paths `text` names after `prefix` (`crate::`, `super::`): for a
/// brace group, each of its entries.
fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find(prefix) {
        let start = at + i;
        at = start + prefix.len();
        // `super::super::x` is read from its first `super::`.
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            || (prefix == "super::" && text[..start].ends_with("super::"))
        {
            continue;
        }
        found.extend(parse_tree(&text[at..], prefix == "super::"));
    }
    found
}

/// The paths of a use tree at the start of `text` (`a::b`, `{a, b::c}`).
/// With `chain`, a leading run of `super::` is kept as segments.
fn parse_tree(text: &str, chain: bool) -> Vec<Vec<String>> {
    let text = text.trim_start();
    if let Some(inner) = text.strip_prefix('{') {
        let mut depth = 0;
        let mut end = inner.len();
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    end = i;
                    break;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        let group = &inner[..end];
        let mut entries = Vec::new();
        let (mut depth, mut from) = (0, 0);
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    entries.push(&group[from..i]);
                    from = i + 1;
                }
                _ => {}
            }
        }
        entries.push(&group[from..]);
        return entries
            .into_iter()
            .filter(|e| !e.trim().is_empty())
            .flat_map(|e| parse_tree(e, chain))
            .collect();
    }
    let ident: String = text
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if ident.is_empty() {
        return Vec::new();
    }
    let rest = &text[ident.len()..];
    match rest.strip_prefix("::") {
        Some(rest) if ident.chars().next().is_some_and(char::is_lowercase) || chain => {
            let mut tails = parse_tree(rest, chain && ident == "super");
            if tails.is_empty() {
                tails.push(Vec::new());
            }
            for tail in &mut tails {
                tail.insert(0, ident.clone());
            }
            tails
        }
        _ => vec![vec![ident]],
    }
}

/// The module each root re-export comes from (`BlockModel` → `model`), read
/// from lib.rs's `pub use` lines.
fn root_items(lib: &str) -> BTreeMap<String, String> {
    let mut items = BTreeMap::new();
    for statement in code_only(lib).split(';') {
        let statement = statement.trim();
        let Some(tree) = statement.strip_prefix("pub use ") else {
            continue;
        };
        for path in parse_tree(tree, false) {
            if let (Some(first), Some(last)) = (path.first(), path.last()) {
                items.insert(last.clone(), first.clone());
            }
        }
    }
    items
}

/// Edges `from → to` between modules at `depth` (0: the top-level modules)
/// inside `parent` (the path of their folder).
struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    /// A cycle, as the modules around it, if there is one.
    fn cycle(&self) -> Option<Vec<String>> {
        fn visit(
            graph: &BTreeMap<String, BTreeSet<String>>,
            node: &str,
            stack: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(pos) = stack.iter().position(|n| n == node) {
                let mut cycle = stack[pos..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            if done.contains(node) {
                return None;
            }
            stack.push(node.to_string());
            for next in graph.get(node).into_iter().flatten() {
                if let Some(cycle) = visit(graph, next, stack, done) {
                    return Some(cycle);
                }
            }
            stack.pop();
            done.insert(node.to_string());
            None
        }
        let mut done = BTreeSet::new();
        for node in self.edges.keys() {
            if let Some(cycle) = visit(&self.edges, node, &mut Vec::new(), &mut done) {
                return Some(cycle);
            }
        }
        None
    }
}

/// For every file, the absolute module paths its code names.
fn uses() -> Vec<(Vec<String>, PathBuf, Vec<Vec<String>>)> {
    let mut files = Vec::new();
    sources(&src(), &[], &mut files);
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let roots = root_items(&lib);
    files
        .into_iter()
        .map(|(module, path)| {
            let text = code_only(&std::fs::read_to_string(&path).expect("source"));
            let is_folder = path.file_name().is_some_and(|n| n == "mod.rs");
            let mut named = Vec::new();
            for prefix in ["crate::", "$crate::"] {
                for mut p in paths_after(&text, prefix) {
                    if p.len() == 1 {
                        if let Some(m) = roots.get(&p[0]) {
                            p = vec![m.clone()];
                        }
                    }
                    named.push(p);
                }
            }
            for p in paths_after(&text, "super::") {
                // `super` of `a/b.rs` (module a::b) is `a`; of `a/mod.rs`, the root.
                let mut base = module.clone();
                if !is_folder {
                    base.pop();
                }
                let mut rest = p.as_slice();
                // `super::super::…`, each step one module up.
                while rest.len() > 1 && rest[0] == "super" {
                    base.pop();
                    rest = &rest[1..];
                }
                let mut full = base;
                full.extend(rest.iter().skip_while(|s| *s == "super").cloned());
                named.push(full);
            }
            (module, path, named)
        })
        .collect()
}

fn layer_of(module: &str) -> usize {
    LAYERS
        .iter()
        .position(|layer| layer.contains(&module))
        .unwrap_or_else(|| panic!("module `{module}` is in no layer of LAYERS"))
}

#[test]
fn every_module_uses_only_its_layer_and_the_ones_before() {
    let mut wrong = Vec::new();
    for (module, path, named) in uses() {
        let Some(from) = module.first() else { continue };
        for target in named {
            let Some(to) = target.first() else { continue };
            if to == from || !LAYERS.iter().any(|l| l.contains(&to.as_str())) {
                continue;
            }
            if layer_of(to) > layer_of(from) {
                wrong.push(format!(
                    "{} uses `{}` (layer `{to}` comes after `{from}`)",
                    path.strip_prefix(src()).unwrap_or(&path).display(),
                    target.join("::")
                ));
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn no_import_cycle_between_modules_at_any_depth() {
    let all = uses();
    // Every module's children (by their paths), to find the sibling an
    // absolute path lands in.
    let mut graphs: BTreeMap<Vec<String>, Graph> = BTreeMap::new();
    for (module, _, named) in &all {
        for target in named {
            // The longest shared prefix is the folder both live in; the next
            // segment of each is the sibling module.
            let shared = module
                .iter()
                .zip(target)
                .take_while(|(a, b)| a == b)
                .count();
            let (Some(from), Some(to)) = (module.get(shared), target.get(shared)) else {
                continue;
            };
            graphs
                .entry(module[..shared].to_vec())
                .or_insert_with(|| Graph {
                    edges: BTreeMap::new(),
                })
                .edges
                .entry(from.clone())
                .or_default()
                .insert(to.clone());
        }
    }
    let cycles: Vec<String> = graphs
        .iter()
        .filter_map(|(folder, graph)| {
            graph.cycle().map(|c| {
                let folder = if folder.is_empty() {
                    "crate".to_string()
                } else {
                    folder.join("::")
                };
                format!("in {folder}: {}", c.join(" → "))
            })
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn no_source_file_is_over_800_lines() {
    let mut files = Vec::new();
    sources(&src(), &[], &mut files);
    assert!(files.len() > 20, "read the sources of burn-offload");
    let long: Vec<String> = files
        .iter()
        .filter_map(|(_, path)| {
            let lines = std::fs::read_to_string(path)
                .expect("source")
                .lines()
                .count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", path.display()))
        })
        .collect();
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}

/// The reader itself: a cycle and a layer breach are seen, comments are not.
#[test]
fn the_reader_sees_uses_and_not_comments() {
    let text = code_only(
        "use crate::{a::b, c::{d, e}};\n// crate::hidden\nlet s = \"crate::quoted\";\nsuper::super::f::g();",
    );
    let crate_paths = paths_after(&text, "crate::");
    assert_eq!(
        crate_paths,
        vec![
            vec!["a".to_string(), "b".to_string()],
            vec!["c".to_string(), "d".to_string()],
            vec!["c".to_string(), "e".to_string()],
        ]
    );
    let supers = paths_after(&text, "super::");
    assert_eq!(supers, vec![vec!["super", "f", "g"]]);
    let graph = Graph {
        edges: BTreeMap::from([
            ("a".to_string(), BTreeSet::from(["b".to_string()])),
            ("b".to_string(), BTreeSet::from(["a".to_string()])),
        ]),
    };
    assert!(graph.cycle().is_some());
    assert!(layer_of("engine") > layer_of("host"));
}
