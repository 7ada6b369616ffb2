//! The layers of `burn-offload/src`: its top-level modules are layers, each
//! using only the layers before it, so no two of them import each other (in
//! a circle or otherwise) and a lower layer never learns of a higher one.
//!
//! The rules every crate obeys (files under 800 lines, no import circle at
//! any depth, typed errors, listed statics) are `workspace_rules.rs`; this
//! file holds the one rule only burn-offload has, its layer order.

mod reader;

use std::path::{Path, PathBuf};

use reader::{code_only, module_of, named_modules, paths_after, root_items, rust_files};

/// The layers, first to last: a module may use its own layer and earlier ones.
const LAYERS: &[&[&str]] = &[
    &["host"],
    &["quant"],
    &["store"],
    &["transfer"],
    &["backend"],
    &["cuda"],
    &["precision", "matmul", "model", "device", "documents"],
    &["ops"],
    &["engine"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../burn-offload/src")
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The layer breaches among `files` (paths relative to `burn-offload/src`,
/// with their text): a file of one top-level module naming a module of a
/// later layer, or a top-level module that is in no layer.
fn layer_breaches(files: &[(String, String)]) -> Vec<String> {
    let roots = files
        .iter()
        .find(|(path, _)| path == "lib.rs")
        .map(|(_, text)| root_items(text))
        .unwrap_or_default();
    let mut wrong = Vec::new();
    for (path, text) in files {
        if path == "lib.rs" {
            continue;
        }
        let module = module_of(path);
        let from = &module[0];
        let Some(from_layer) = layer_of(from) else {
            wrong.push(format!("{path}: module `{from}` is in no layer of LAYERS"));
            continue;
        };
        let folder = path.ends_with("mod.rs");
        for (written, target) in named_modules(&module, folder, &code_only(text), &roots) {
            let Some(to) = target.first() else { continue };
            if layer_of(to).is_some_and(|to_layer| to_layer > from_layer) {
                wrong.push(format!(
                    "{path} uses `{written}` (layer `{to}` comes after `{from}`)"
                ));
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    wrong
}

/// burn-offload's real sources pass: a lower layer that learned of a higher
/// one would tie the host side to the engine, or the engine's users to CUDA.
#[test]
fn every_module_uses_only_its_layer_and_the_ones_before() {
    let mut paths = Vec::new();
    rust_files(&src(), &src(), &[], &mut paths);
    assert!(paths.len() > 20, "read the sources of burn-offload");
    let files: Vec<(String, String)> = paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(src().join(&p)).expect("source");
            (p, text)
        })
        .collect();
    let wrong = layer_breaches(&files);
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

/// The check fails on a breach: `host` (the first layer) naming the engine,
/// directly, through a root re-export, or through `super::`; and on a new
/// top-level module nobody placed in a layer.
#[test]
fn a_lower_layer_naming_a_higher_one_is_a_breach() {
    let file = |path: &str, text: &str| (path.to_string(), text.to_string());
    let lib = file(
        "lib.rs",
        "mod engine;\nmod host;\npub use engine::Engine;\n",
    );
    let clean = [
        lib.clone(),
        file(
            "host/slab.rs",
            "use crate::host::x;\n// crate::engine::Engine\n",
        ),
        file("engine/mod.rs", "use crate::host::slab::Slab;\n"),
    ];
    assert!(layer_breaches(&clean).is_empty());
    for breach in [
        "use crate::engine::Engine;",
        "fn f() -> crate::Engine { todo!() }",
        "use super::super::engine::build;",
    ] {
        let files = [lib.clone(), file("host/slab.rs", breach)];
        let wrong = layer_breaches(&files);
        assert_eq!(wrong.len(), 1, "{breach}: {wrong:?}");
        assert!(wrong[0].contains("layer `engine` comes after `host`"));
    }
    let unplaced = [lib, file("gadgets.rs", "")];
    assert_eq!(
        layer_breaches(&unplaced),
        vec!["gadgets.rs: module `gadgets` is in no layer of LAYERS"]
    );
}

/// The reader itself: uses are seen, comments and strings are not.
#[test]
fn the_reader_sees_uses_and_not_comments() {
    let text = code_only(
        "use crate::{a::b, c::{d, e}};\n// crate::hidden\nlet s = \"crate::quoted\";\nsuper::super::f::g();\nlet r = r#\"crate::raw \"quoted\"\"#;\n/* crate::block\n */ let c = '\"';",
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
    assert_eq!(text.lines().count(), 7, "newlines kept: {text}");
    assert!(layer_of("engine") > layer_of("host"));
}
