//! Rules every crate of the workspace obeys (issue 51), checked here so CI
//! catches a breach the day it is written rather than at the next review:
//!
//! 1. no `.rs` file passes 800 lines: a file that long holds several things
//!    that want their own names, and is hard to review and to split later;
//! 2. no import circle: within every folder of every crate the modules
//!    import each other without cycles, so each can be read, tested and
//!    moved knowing only those it names;
//! 3. library crates return typed errors: no `anyhow`, no
//!    `Result<_, String>` or `Result<_, &str>`, so callers can match on what
//!    went wrong instead of parsing text;
//! 4. every process-wide static is listed, with its reason, in
//!    docs/ARCHITECTURE.md §3: global state is a design decision that
//!    everyone reading the code should find written down.
//!
//! The crates are the members of the root Cargo.toml's `[workspace]` plus
//! any crate under `examples/`, so adding or moving a crate needs no edit
//! here. Each rule is a function over `(path, text)` pairs; the synthetic
//! tests at the end show each one failing on a breach. burn-offload's own
//! layer order is `layers.rs`.

mod crates;
mod reader;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crates::{crates, read, root, strip_test_code, toml_strings, toml_value, units, Kind, Unit};
use reader::{code_only, module_of, named_modules, root_items, rust_files};

const MAX_LINES: usize = 800;

/// Files the line rule skips, by workspace path, each with its reason. Only
/// generated forwarding belongs here (a file nobody edits by hand); none is
/// today.
const GENERATED: &[(&str, &str)] = &[];

/// Breaches the workspace still owes, by rule and file, each with the work
/// that pays it off. A breach not listed here fails its test, and so does
/// an entry whose breach is gone: the list only shrinks. None is owed
/// today (issue 51's typed errors paid off the last).
const OWED: &[(&str, &str)] = &[];

/// One breach: the rule, the file (or folder) and what is wrong.
#[derive(Debug)]
struct Violation {
    rule: &'static str,
    file: String,
    detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.rule, self.file, self.detail)
    }
}

fn violation(rule: &'static str, file: &str, detail: String) -> Violation {
    Violation {
        rule,
        file: file.to_string(),
        detail,
    }
}

/// Fails with every violation not in [`OWED`] on its own line, and with
/// every entry of [`OWED`] for `rule` whose breach is gone.
fn assert_none(rule: &str, what: &str, violations: &[Violation]) {
    let owed = |v: &Violation| OWED.iter().any(|(r, f)| *r == v.rule && *f == v.file);
    let paid: Vec<String> = OWED
        .iter()
        .filter(|(r, _)| *r == rule)
        .filter(|(r, f)| !violations.iter().any(|v| v.rule == *r && v.file == *f))
        .map(|(r, f)| format!("{r}: {f}: no longer breached; remove it from OWED"))
        .collect();
    assert!(paid.is_empty(), "{}", paid.join("\n"));
    let violations: Vec<&Violation> = violations.iter().filter(|v| !owed(v)).collect();
    let lines: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        lines.is_empty(),
        "{} {what}:\n{}",
        lines.len(),
        lines.join("\n")
    );
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].matches('\n').count() + 1
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Where `word` stands alone in `code` (not inside a longer identifier).
fn word_at(code: &str, word: &str) -> Vec<usize> {
    code.match_indices(word)
        .filter(|(at, _)| {
            !code[..*at].chars().next_back().is_some_and(is_ident)
                && !code[at + word.len()..].chars().next().is_some_and(is_ident)
        })
        .map(|(at, _)| at)
        .collect()
}

// ----------------------------------------------------------------- the rules

/// Rule 1: files (workspace path, text) over [`MAX_LINES`] lines, less
/// [`GENERATED`].
fn long_files(files: &[(String, String)]) -> Vec<Violation> {
    files
        .iter()
        .filter(|(path, _)| !GENERATED.iter().any(|(g, _)| g == path))
        .filter_map(|(path, text)| {
            let lines = text.lines().count();
            (lines > MAX_LINES).then(|| {
                violation(
                    "lines",
                    path,
                    format!("{lines} lines (at most {MAX_LINES})"),
                )
            })
        })
        .collect()
}

/// Who imports whom among the sibling modules of one folder, with the first
/// place each edge is seen (`file names crate::a::b`).
#[derive(Default)]
struct Graph {
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

impl Graph {
    /// The knots: each set of two or more modules that reach each other
    /// (Tarjan's strongly connected components), sorted.
    fn knots(&self) -> Vec<Vec<String>> {
        struct Walk<'g> {
            graph: &'g Graph,
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            knots: Vec<Vec<String>>,
        }
        fn visit<'g>(w: &mut Walk<'g>, node: &'g str) {
            let n = w.index.len();
            w.index.insert(node, n);
            w.low.insert(node, n);
            w.stack.push(node);
            for next in w.graph.edges.get(node).into_iter().flat_map(|e| e.keys()) {
                if !w.index.contains_key(next.as_str()) {
                    visit(w, next);
                    let low = w.low[node].min(w.low[next.as_str()]);
                    w.low.insert(node, low);
                } else if w.stack.contains(&next.as_str()) {
                    let low = w.low[node].min(w.index[next.as_str()]);
                    w.low.insert(node, low);
                }
            }
            if w.low[node] == w.index[node] {
                let at = w.stack.iter().position(|m| *m == node).unwrap();
                let mut knot: Vec<String> = w.stack.drain(at..).map(str::to_string).collect();
                if knot.len() > 1 {
                    knot.sort();
                    w.knots.push(knot);
                }
            }
        }
        let mut walk = Walk {
            graph: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            knots: Vec::new(),
        };
        for node in self.edges.keys() {
            if !walk.index.contains_key(node.as_str()) {
                visit(&mut walk, node);
            }
        }
        walk.knots.sort();
        walk.knots
    }
}

/// Rule 2: import circles in one module tree (`dir`, its root files and its
/// files relative to `dir`): at every depth, the modules of one folder must
/// import each other without cycles. Each knot is one violation, naming
/// every edge inside it and where it comes from.
fn import_circles(dir: &str, roots: &[String], files: &[(String, String)]) -> Vec<Violation> {
    let is_root = |path: &String| roots.contains(path);
    let mut items = BTreeMap::new();
    for (_, text) in files.iter().filter(|(p, _)| is_root(p)) {
        items.extend(root_items(text));
    }
    let mut graphs: BTreeMap<Vec<String>, Graph> = BTreeMap::new();
    for (path, text) in files {
        let module = if is_root(path) {
            Vec::new()
        } else {
            module_of(path)
        };
        let folder = is_root(path) || path == "mod.rs" || path.ends_with("/mod.rs");
        for (written, target) in named_modules(&module, folder, &code_only(text), &items) {
            // The longest shared prefix is the folder both live in; the next
            // segment of each is the sibling module.
            let shared = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            let (Some(from), Some(to)) = (module.get(shared), target.get(shared)) else {
                continue;
            };
            let graph = graphs.entry(module[..shared].to_vec()).or_default();
            let seen = format!("{path}: {written}");
            let edges = graph.edges.entry(from.clone()).or_default();
            edges.entry(to.clone()).or_insert(seen);
        }
    }
    let mut found = Vec::new();
    for (folder, graph) in &graphs {
        for knot in graph.knots() {
            let mut why = Vec::new();
            for from in &knot {
                for (to, seen) in &graph.edges[from] {
                    if knot.contains(to) {
                        why.push(format!("{from} → {to} ({seen})"));
                    }
                }
            }
            let place = std::iter::once(dir.to_string())
                .chain(folder.iter().cloned())
                .collect::<Vec<_>>()
                .join("/");
            let detail = format!("{} import each other: {}", knot.join(", "), why.join("; "));
            found.push(violation("import-circle", &place, detail));
        }
    }
    found
}

/// Whether a `Result`'s error type is text.
fn is_text(error: &str) -> bool {
    let e: String = error.chars().filter(|c| !c.is_whitespace()).collect();
    let lifetime = |s: &str| {
        s.strip_prefix('\'')
            .is_some_and(|l| l.chars().all(is_ident))
    };
    matches!(
        e.as_str(),
        "String" | "std::string::String" | "alloc::string::String"
    ) || e
        .strip_prefix('&')
        .and_then(|r| r.strip_suffix("str"))
        .is_some_and(|l| l.is_empty() || lifetime(l))
}

/// The type arguments of the generic list opening at `code[at]` (`<`),
/// split at its top-level commas.
fn type_arguments(code: &str, at: usize) -> Vec<String> {
    let (mut args, mut from, mut depth) = (Vec::new(), at + 1, 0);
    let mut prev = ' ';
    for (i, c) in code[at..].char_indices() {
        let i = at + i;
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' if prev == '-' => {}
            '>' | ')' | ']' => {
                depth -= 1;
                if depth == 0 {
                    args.push(code[from..i].trim().to_string());
                    return args;
                }
            }
            ',' if depth == 1 => {
                args.push(code[from..i].trim().to_string());
                from = i + 1;
            }
            ';' | '{' => return Vec::new(),
            _ => {}
        }
        prev = c;
    }
    Vec::new()
}

/// Rule 3: `anyhow`, and `Result`s whose error is a `String` or `&str`
/// (a function's return, a closure's, an alias), in library files
/// (workspace path, text; test code is left out here).
fn untyped_errors(files: &[(String, String)]) -> Vec<Violation> {
    let mut found = Vec::new();
    for (path, text) in files {
        let code = strip_test_code(&code_only(text)).0;
        let anyhow: BTreeSet<usize> = word_at(&code, "anyhow")
            .into_iter()
            .map(|at| line_of(&code, at))
            .collect();
        if !anyhow.is_empty() {
            let lines: Vec<String> = anyhow.iter().map(ToString::to_string).collect();
            let detail = format!("uses anyhow (lines {})", lines.join(", "));
            found.push(violation("typed-errors", path, detail));
        }
        for at in word_at(&code, "Result") {
            let open = at + "Result".len();
            if !code[open..].starts_with('<') {
                continue;
            }
            let args = type_arguments(&code, open);
            if let [ok, error] = args.as_slice() {
                if is_text(error) {
                    let detail = format!(
                        "line {}: Result<{ok}, {error}> (an error as text, not a thiserror type)",
                        line_of(&code, at)
                    );
                    found.push(violation("typed-errors", path, detail));
                }
            }
        }
    }
    found
}

/// The `static` items of `code` (from `code_only`): `static`, `static mut`
/// and those inside `thread_local!`, with their lines.
fn statics(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for at in word_at(code, "static") {
        if code[..at].ends_with('\'') {
            continue; // `'static`, a lifetime
        }
        let rest = code[at + "static".len()..].trim_start();
        let rest = rest
            .strip_prefix("mut")
            .filter(|r| r.starts_with(char::is_whitespace))
            .map_or(rest, str::trim_start);
        let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if !name.is_empty() && rest[name.len()..].trim_start().starts_with(':') {
            found.push((name, line_of(code, at)));
        }
    }
    found
}

const ARCHITECTURE: &str = "docs/ARCHITECTURE.md";

/// The rows (file, static, reason) of the "Process-wide statics" table in
/// §3 of ARCHITECTURE.md, or why there is none.
fn listed_statics(architecture: &str) -> Result<Vec<(String, String, String)>, &'static str> {
    let section: Vec<&str> = architecture
        .lines()
        .skip_while(|l| !l.starts_with("## 3."))
        .take_while(|l| !l.starts_with("## 4."))
        .collect();
    let heading = section
        .iter()
        .position(|l| l.starts_with('#') && l.contains("Process-wide statics"))
        .ok_or("§3 has no \"Process-wide statics\" table")?;
    let rows = section[heading + 1..]
        .iter()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.split('|')
                .map(|c| c.trim().trim_matches('`'))
                .collect::<Vec<_>>()
        })
        .filter(|cells| cells.len() >= 4 && cells[1] != "static" && !cells[1].starts_with('-'))
        .map(|cells| {
            let reason = cells[3..cells.len() - 1].join("|");
            (cells[2].to_string(), cells[1].to_string(), reason)
        })
        .collect();
    Ok(rows)
}

/// Rule 4: the statics of `files` (workspace path, text; non-test code)
/// against the table in `architecture`: one not listed, one listed that is
/// gone, one listed without a reason.
fn unlisted_statics(files: &[(String, String)], architecture: &str) -> Vec<Violation> {
    let listed = match listed_statics(architecture) {
        Ok(rows) => rows,
        Err(why) => return vec![violation("statics", ARCHITECTURE, why.to_string())],
    };
    let mut found: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (path, text) in files {
        for (name, line) in statics(&strip_test_code(&code_only(text)).0) {
            found.entry((path.clone(), name)).or_default().push(line);
        }
    }
    let mut counted: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    for (file, name, reason) in &listed {
        *counted.entry((file.clone(), name.clone())).or_default() += 1;
        if reason.is_empty() {
            let detail = format!("`{name}` of {file} is listed without its reason");
            wrong.push(violation("statics", ARCHITECTURE, detail));
        }
    }
    for ((file, name), lines) in &found {
        let listed = counted
            .get(&(file.clone(), name.clone()))
            .copied()
            .unwrap_or(0);
        if listed < lines.len() {
            let lines: Vec<String> = lines.iter().map(ToString::to_string).collect();
            let detail = format!(
                "static `{name}` (line {}) is not listed in {ARCHITECTURE} §3 \"Process-wide statics\" ({listed} row(s) for it)",
                lines.join(", ")
            );
            wrong.push(violation("statics", file, detail));
        }
    }
    for ((file, name), listed) in &counted {
        let exists = found.get(&(file.clone(), name.clone())).map_or(0, Vec::len);
        if *listed > exists {
            let detail = format!(
                "lists static `{name}` of {file} {listed} time(s), the code has {exists}: remove the row"
            );
            wrong.push(violation("statics", ARCHITECTURE, detail));
        }
    }
    wrong
}

// ------------------------------------------------------- the workspace today

/// Every module tree of every crate.
fn all_units() -> Vec<Unit> {
    crates().iter().flat_map(|c| units(c)).collect()
}

/// The crates come from Cargo.toml (and `examples/`), not from a list here.
#[test]
fn the_crates_are_read_from_the_workspace_members() {
    let crates = crates();
    let manifest = read(&root().join("Cargo.toml"));
    let members = toml_strings(&toml_value(&manifest, "workspace", "members").unwrap());
    for member in members.iter().filter(|m| !m.contains('*')) {
        assert!(crates.contains(member), "{member} missing from {crates:?}");
    }
    assert!(crates.contains(&"burn-offload".to_string()) && crates.contains(&"tests".to_string()));
    for krate in &crates {
        assert!(!units(krate).is_empty(), "{krate} has no sources");
    }
    let mine = all_units()
        .into_iter()
        .find(|u| u.dir == "tests/tests")
        .expect("this file's unit");
    assert!(mine.roots.contains(&"workspace_rules.rs".to_string()));
    assert_eq!(mine.kind, Kind::Test);
}

/// Rule 1 on the workspace: every `.rs` file of every crate (sources,
/// kernels, tests, benches, programs), `target/` and `vendor/` aside.
#[test]
fn no_rust_file_in_any_crate_is_over_800_lines() {
    for (file, why) in GENERATED {
        assert!(!why.is_empty(), "{file} is exempt without a reason");
        assert!(root().join(file).is_file(), "{file} is exempt but gone");
    }
    let mut files = Vec::new();
    for krate in crates() {
        let base = root().join(&krate);
        let mut paths = Vec::new();
        rust_files(&base, &base, &["target", "vendor"], &mut paths);
        for p in paths {
            let text = read(&base.join(&p));
            files.push((format!("{krate}/{p}"), text));
        }
    }
    assert!(files
        .iter()
        .any(|(p, _)| p == "tests/tests/workspace_rules.rs"));
    assert_none("lines", "files over the line limit", &long_files(&files));
}

/// Rule 2 on the workspace: every module tree of every crate (library,
/// programs, tests), at every depth.
#[test]
fn no_import_circle_in_any_crate() {
    let found: Vec<Violation> = all_units()
        .iter()
        .flat_map(|u| import_circles(&u.dir, &u.roots, &u.files))
        .collect();
    assert_none("import-circle", "import circles", &found);
}

/// Rule 3 on the workspace: the `[lib]` trees, less their test code;
/// programs (`src/bin/`, `main.rs`) may report errors as they like.
#[test]
fn library_crates_return_typed_errors() {
    let files: Vec<(String, String)> = all_units()
        .iter()
        .filter(|u| u.kind == Kind::Library)
        .flat_map(Unit::non_test_files)
        .collect();
    assert!(files.iter().any(|(p, _)| p == "burn-offload/src/lib.rs"));
    assert_none(
        "typed-errors",
        "untyped errors in library crates",
        &untyped_errors(&files),
    );
}

/// Rule 4 on the workspace: the statics of every crate's non-test code
/// against the table in ARCHITECTURE.md §3, both ways.
#[test]
fn every_process_wide_static_is_listed_in_architecture() {
    let files: Vec<(String, String)> = all_units().iter().flat_map(Unit::non_test_files).collect();
    let architecture = read(&root().join(ARCHITECTURE));
    assert_none(
        "statics",
        "unlisted statics",
        &unlisted_statics(&files, &architecture),
    );
}

// ------------------------------------------------ each rule fails on a breach

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

/// Rule 1 fails on a file of 801 lines and passes one of 800.
#[test]
fn an_801_line_file_breaks_the_line_rule() {
    let just = "fn f() {}\n".repeat(MAX_LINES);
    let over = format!("{just}// one more\n");
    let found = long_files(&files(&[
        ("a/src/ok.rs", &just),
        ("a/tests/long.rs", &over),
    ]));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].to_string(),
        "lines: a/tests/long.rs: 801 lines (at most 800)"
    );
}

/// Rule 2 fails on two modules naming each other, by `crate::`, `super::`
/// or a root re-export, at the top and inside a folder; one way is fine.
#[test]
fn a_two_module_import_circle_is_found() {
    let roots = ["lib.rs".to_string()];
    let lib = ("lib.rs", "mod a;\nmod b;\npub use b::Item;\n");
    let one_way = files(&[lib, ("a.rs", "use crate::b::B;"), ("b.rs", "// crate::a\n")]);
    assert!(import_circles("k/src", &roots, &one_way).is_empty());
    for back in ["use super::a::A;", "fn f(_: crate::a::A) {}"] {
        let circle = files(&[lib, ("a.rs", "use crate::b::B;"), ("b.rs", back)]);
        let found = import_circles("k/src", &roots, &circle);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0]
            .to_string()
            .starts_with("import-circle: k/src: a, b import each other"));
    }
    // Through a root re-export, and inside a folder.
    let nested = files(&[
        lib,
        ("a.rs", "use crate::Item;"),
        ("b/mod.rs", "mod x; mod y;"),
        ("b/x.rs", "use super::y::Y; pub struct Item;"),
        ("b/y.rs", "use crate::b::x::X; use crate::a::A;"),
    ]);
    let found: Vec<String> = import_circles("k/src", &roots, &nested)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("import-circle: k/src: a, b import each other"));
    assert!(found[1].starts_with("import-circle: k/src/b: x, y import each other"));
}

/// Rule 3 fails on `anyhow` in library code, not in a comment or a test.
#[test]
fn anyhow_in_a_library_is_found() {
    let lib = files(&[
        (
            "k/src/a.rs",
            "use anyhow::Result;\n\nfn f() -> anyhow::Result<()> { Ok(()) }",
        ),
        ("k/src/b.rs", "// anyhow is for programs\nfn nohow() {}\n"),
        (
            "k/src/c.rs",
            "#[cfg(test)]\nmod tests { use anyhow::Result; }\n",
        ),
    ]);
    let found = untyped_errors(&lib);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].to_string(),
        "typed-errors: k/src/a.rs: uses anyhow (lines 1, 3)"
    );
}

/// Rule 3 fails on a `Result` whose error is a `String` or `&str`, wherever
/// the type is written; text as the `Ok` value, and test code, are fine.
#[test]
fn a_result_with_a_text_error_is_found() {
    for breach in [
        "pub fn f() -> Result<u8, String> { todo!() }",
        "fn f() -> std::result::Result<(), &'static str> { todo!() }",
        "fn f(x: &str) -> Result<Vec<(u8, u16)>, &str> { todo!() }",
        "let g = || -> Result<impl Fn() -> u8, String> { todo!() };",
        "type Out<T> = Result<T, std::string::String>;",
    ] {
        let found = untyped_errors(&files(&[("k/src/a.rs", breach)]));
        assert_eq!(found.len(), 1, "{breach}: {found:?}");
        assert!(found[0].detail.starts_with("line 1: Result<"), "{found:?}");
    }
    for typed in [
        "fn f() -> Result<String, MyError> { todo!() }",
        "fn f() -> Result<&str, Error> { todo!() } // Result<(), String>",
        "fn f() -> io::Result<String> { todo!() }",
        "#[cfg(test)]\nfn t() -> Result<(), String> { Ok(()) }",
    ] {
        let found = untyped_errors(&files(&[("k/src/a.rs", typed)]));
        assert!(found.is_empty(), "{typed}: {found:?}");
    }
}

/// A table with `COUNT` and a `GONE` that the code no longer has.
const DOC: &str = "## 3. Layers\n\n### Process-wide statics\n\n| static | file | why |\n|---|---|---|\n| `COUNT` | `k/src/a.rs` | counts across threads |\n| `GONE` | `k/src/a.rs` | was here |\n\n## 4. Other\n";

/// Rule 4 fails on a static missing from the table (plain, `mut`, inside
/// `thread_local!` or a function), on a row whose static is gone, and when
/// there is no table; a `'static` lifetime, a string and test code are not
/// statics.
#[test]
fn an_unlisted_static_is_found() {
    let code = "static COUNT: AtomicU64 = AtomicU64::new(0);\n\
        pub(crate) static mut RAW: u8 = 0;\n\
        thread_local! {\n    static LOCAL: Cell<u8> = const { Cell::new(0) };\n}\n\
        fn f() -> &'static str { static INSIDE: OnceLock<u8> = OnceLock::new(); \"static X: u8\" }\n\
        #[cfg(test)]\nmod tests { static TEST_ONLY: u8 = 0; }\n";
    let found: Vec<String> = unlisted_statics(&files(&[("k/src/a.rs", code)]), DOC)
        .iter()
        .map(ToString::to_string)
        .collect();
    let unlisted = |name: &str, line: usize| {
        format!("statics: k/src/a.rs: static `{name}` (line {line}) is not listed in docs/ARCHITECTURE.md §3 \"Process-wide statics\" (0 row(s) for it)")
    };
    assert_eq!(
        found,
        vec![
            unlisted("INSIDE", 6),
            unlisted("LOCAL", 4),
            unlisted("RAW", 2),
            "statics: docs/ARCHITECTURE.md: lists static `GONE` of k/src/a.rs 1 time(s), the code has 0: remove the row".to_string(),
        ]
    );
    let no_table = unlisted_statics(&[], "## 3. Layers\n\nstatics are here\n## 4.\n");
    assert_eq!(no_table.len(), 1);
}

/// `#[cfg(test)]` items are left out of library code, and a `mod tests;`
/// under it names a test file, so rules 3 and 4 skip tests.
#[test]
fn test_code_is_told_from_library_code() {
    let (code, modules) = strip_test_code(&code_only(
        "#[cfg(test)]\nmod tests;\n#[cfg(test)]\n#[allow(unused)]\nmod more { fn f() { if x { } } }\nstatic KEPT: u8 = 0;\n",
    ));
    assert_eq!(modules, vec!["tests"]);
    assert_eq!(statics(&code), vec![("KEPT".to_string(), 6)]);
}

/// The members come from `[workspace]` alone: comments, other tables and
/// arrays over several lines do not confuse the reader.
#[test]
fn members_are_read_from_the_workspace_table() {
    let manifest = "[package]\nmembers = [\"no\"]\n[workspace] # the crates\nmembers = [\n  \"a\", # first\n  \"b/*\",\n]\n[lib]\npath = \"src/x.rs\"\n";
    let members = toml_value(manifest, "workspace", "members").unwrap();
    assert_eq!(toml_strings(&members), vec!["a", "b/*"]);
    assert_eq!(toml_value(manifest, "lib", "path").unwrap(), "\"src/x.rs\"");
}
