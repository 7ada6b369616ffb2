//! A small reader of Rust sources, shared by `layers.rs` and
//! `workspace_rules.rs`: code without comments and strings, and the module
//! paths a file names through `crate::…`, `$crate::…` and `super::…` (how
//! our crates refer to their own modules). A reader rather than a parser
//! dependency: the rules need only these paths, and the tests crate takes
//! no new dependency for them.

use std::collections::BTreeMap;
use std::path::Path;

/// `text` without comments and string literals (so docs naming a path do
/// not count as uses). Each string becomes `""`; char literals go; every
/// newline stays, so a line number in the result is one in `text`.
pub fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let newlines = |out: &mut String, dropped: &[char]| {
        out.extend(dropped.iter().filter(|ch| **ch == '\n'));
    };
    let mut i = 0;
    while i < c.len() {
        let (ch, next) = (c[i], c.get(i + 1).copied());
        let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if ch == '/' && next == Some('*') {
            // Block comments nest in Rust.
            let (start, mut depth) = (i, 0);
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            newlines(&mut out, &c[start..i.min(c.len())]);
            continue;
        }
        // Raw strings: r"…", r#"…"#, br"…" (no escapes inside).
        if !ident_before && (ch == 'r' || (ch == 'b' && next == Some('r'))) {
            let mut j = i + if ch == 'b' { 2 } else { 1 };
            let hashes = c[j.min(c.len())..]
                .iter()
                .take_while(|h| **h == '#')
                .count();
            j += hashes;
            if c.get(j) == Some(&'"') {
                let mut k = j + 1;
                while k < c.len()
                    && !(c[k] == '"' && (1..=hashes).all(|h| c.get(k + h) == Some(&'#')))
                {
                    k += 1;
                }
                out.push('"');
                newlines(&mut out, &c[j + 1..k.min(c.len())]);
                out.push('"');
                i = k + 1 + hashes;
                continue;
            }
        }
        if ch == '"' {
            let (mut k, mut escaped) = (i + 1, false);
            while k < c.len() && (escaped || c[k] != '"') {
                escaped = !escaped && c[k] == '\\';
                k += 1;
            }
            out.push('"');
            newlines(&mut out, &c[i + 1..k.min(c.len())]);
            out.push('"');
            i = k + 1;
            continue;
        }
        // A char literal such as '"', '{' or '\u{7f}' (not a lifetime).
        if ch == '\'' {
            if next == Some('\\') {
                if let Some(end) = (i + 3..(i + 12).min(c.len())).find(|k| c[*k] == '\'') {
                    out.push('\'');
                    i = end + 1;
                    continue;
                }
            } else if c.get(i + 2) == Some(&'\'') {
                out.push('\'');
                i += 3;
                continue;
            }
        }
        out.push(ch);
        i += 1;
    }
    out
}

/// The paths `text` names after `prefix` (`crate::`, `super::`): for a
/// brace group, each of its entries.
pub fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
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
pub fn parse_tree(text: &str, chain: bool) -> Vec<Vec<String>> {
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
/// from a crate root's `pub use` lines.
pub fn root_items(root: &str) -> BTreeMap<String, String> {
    let mut items = BTreeMap::new();
    for statement in code_only(root).split(';') {
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

/// The module of a file, from its path relative to the crate's source
/// folder: `engine/head.rs` is `["engine", "head"]`, `engine/mod.rs` is
/// `["engine"]`. A crate root (`lib.rs`, `main.rs`, a test file) is `[]`
/// and is not passed here.
pub fn module_of(relative: &str) -> Vec<String> {
    let mut module: Vec<String> = relative
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if module.last().is_some_and(|m| m == "mod") {
        module.pop();
    }
    module
}

/// The module paths `code` (from [`code_only`]) names, for a file of
/// module `module`: each as written (`crate::Item`, `super::a::b`) and as
/// the absolute path it reaches. `folder`: the file is its folder's module
/// (`mod.rs` or a crate root), so its `super` is one step further up.
/// `roots`: the crate root's re-exports ([`root_items`]), so `crate::Item`
/// counts as a use of the module it comes from.
pub fn named_modules(
    module: &[String],
    folder: bool,
    code: &str,
    roots: &BTreeMap<String, String>,
) -> Vec<(String, Vec<String>)> {
    let mut named = Vec::new();
    for prefix in ["crate::", "$crate::"] {
        for p in paths_after(code, prefix) {
            let written = format!("{prefix}{}", p.join("::"));
            match roots.get(&p[0]) {
                Some(m) if p.len() == 1 => named.push((written, vec![m.clone()])),
                _ => named.push((written, p)),
            }
        }
    }
    for p in paths_after(code, "super::") {
        // `super` of `a/b.rs` (module a::b) is `a`; of `a/mod.rs`, the root.
        let mut base = module.to_vec();
        if !folder {
            base.pop();
        }
        let mut rest = p.as_slice();
        // `super::super::…`, each step one module up.
        while rest.len() > 1 && rest[0] == "super" {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().skip_while(|s| *s == "super").cloned());
        named.push((format!("super::{}", p.join("::")), base));
    }
    named
}

/// Every `.rs` file under `dir`, as paths relative to `base` with `/`
/// between folders, sorted; folders named in `skip` (relative to `base`)
/// are left out.
pub fn rust_files(base: &Path, dir: &Path, skip: &[&str], out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let relative = path
            .strip_prefix(base)
            .expect("under base")
            .to_string_lossy()
            .replace('\\', "/");
        if skip.contains(&relative.as_str()) {
            continue;
        }
        if path.is_dir() {
            rust_files(base, &path, skip, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(relative);
        }
    }
}
