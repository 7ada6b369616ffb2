//! `cargo run --bin train` and `cargo test --workspace` build every
//! dependency with the same features, so the suite after a first run
//! compiles only the workspace's own crates and their tests, not burn again.
//!
//! `cargo run --bin train` resolves features over the workspace's default
//! members (all of them) without dev-dependencies; `cargo test --workspace`
//! over all members with them. `cargo tree` prints both resolutions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// Features of each package (`name version`) in a `cargo tree` resolution.
fn features(args: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(cargo)
        .current_dir(root)
        .args([
            "tree",
            "--locked",
            "--offline",
            "--prefix",
            "none",
            "-f",
            "{p} {f}",
        ])
        .args(args)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut packages: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        if parts.len() < 2 {
            continue;
        }
        // `name v1.2.3 [(path)] [features]`; a repeated package ends in `(*)`.
        let features = parts
            .last()
            .filter(|f| parts.len() > 2 && !f.starts_with('(') && !f.ends_with(')'))
            .map_or("", |f| f);
        packages
            .entry(format!("{} {}", parts[0], parts[1]))
            .or_default()
            .extend(
                features
                    .split(',')
                    .filter(|f| !f.is_empty())
                    .map(str::to_owned),
            );
    }
    packages
}

#[test]
fn the_train_program_and_the_test_suite_build_dependencies_alike() {
    let run = features(&["-e", "normal,build"]);
    let test = features(&["--workspace", "-e", "normal,build,dev"]);
    assert!(run.contains_key("burn-core v0.21.0"), "{run:?}");
    let differ: Vec<String> = run
        .iter()
        .filter_map(|(package, ours)| {
            let theirs = test.get(package)?;
            (ours != theirs).then(|| {
                format!(
                    "{package}: the tests add {:?}",
                    theirs.difference(ours).collect::<Vec<_>>()
                )
            })
        })
        .collect();
    assert!(
        differ.is_empty(),
        "`cargo test --workspace` would rebuild these after `cargo run --bin train`:\n{}",
        differ.join("\n")
    );
}
