//! `--config FILE` and the `config.toml` beside checkpoints (issue 52): a
//! file's keys under the command line's flags, a resume that needs no flag
//! repeated, and bad files refused in one line before anything is written.

mod common;

use std::path::Path;

/// The `config.toml` a run wrote into `dir`, parsed.
fn saved(dir: &Path) -> toml::Table {
    let text = std::fs::read_to_string(dir.join("config.toml")).unwrap();
    toml::from_str(&text).unwrap()
}

/// The (step, loss) lines of a metrics file, markers left out.
fn losses(path: &Path) -> Vec<(u64, f64)> {
    common::metrics(path)
        .iter()
        .filter(|l| l.get("loss").is_some())
        .map(|l| (l["step"].as_u64().unwrap(), l["loss"].as_f64().unwrap()))
        .collect()
}

/// A file's keys resolve under the flags given: a flag replaces its key (an
/// array whole), the others keep the file's value or the default, and the
/// run's own `--resume`/`--stop-after` are not saved; paths are absolute.
#[test]
fn flags_override_the_file_and_the_run_saves_what_resolved() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("run.toml");
    std::fs::write(
        &file,
        "# a tiny run\nsteps = 5\nbatch = 2\nseq-len = 8\nlr = 2e-3\n\
         adam-betas = [0.9, 0.95]\nsample-tokens = 1\nfused = true\n",
    )
    .unwrap();
    let ck = tmp.path().join("ck");
    let out = common::train(
        &["--config", file.to_str().unwrap()],
        &[
            "--steps",
            "3",
            "--adam-betas",
            "0.8,0.9",
            "--stop-after",
            "1",
            "--checkpoint-dir",
            ck.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let saved = saved(&ck);
    let int = |key: &str| saved[key].as_integer().unwrap();
    assert_eq!(int("steps"), 3, "the flag over the file");
    assert_eq!((int("batch"), int("seq-len")), (2, 8), "the file's");
    assert_eq!(int("seed"), 42, "the default");
    assert_eq!(saved["lr"].as_float(), Some(2e-3));
    assert_eq!(saved["fused"].as_bool(), Some(true));
    assert_eq!(saved["no-packing"].as_bool(), Some(false));
    assert_eq!(
        saved["adam-betas"].as_array().unwrap(),
        &vec![toml::Value::Float(0.8), toml::Value::Float(0.9)]
    );
    assert_eq!(
        saved["checkpoint-dir"].as_str(),
        Some(std::path::absolute(&ck).unwrap().to_str().unwrap())
    );
    assert!(!saved.contains_key("stop-after") && !saved.contains_key("resume"));
    // A key the file gives counts as given: the flag rules apply to it.
    std::fs::write(&file, "keep = 3\n").unwrap();
    let out = common::train(&["--config", file.to_str().unwrap()], &[]);
    assert_eq!(
        common::error_lines(&out),
        ["error: --keep needs --checkpoint-dir"]
    );
}

/// A run stopped with --stop-after and resumed with `--resume DIR` alone
/// (its options read from the folder's config.toml, from another working
/// folder) logs the losses of the run that was never stopped, bit for bit;
/// a flag given with --resume still meets the checkpoint's checks.
#[test]
fn a_resume_with_no_flags_continues_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        let ck = tmp.path().join(name);
        let metrics = tmp.path().join(format!("{name}.jsonl"));
        let mut args = vec![
            "--steps",
            "4",
            "--warmup",
            "1",
            "--checkpoint-dir",
            ck.to_str().unwrap(),
            "--metrics",
            metrics.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = common::train(&common::FAST, &args);
        assert!(out.status.success(), "{out:?}");
        (ck, metrics)
    };
    let (_, whole) = run("whole", &[]);
    let (ck, stopped) = run("stopped", &["--stop-after", "2"]);
    assert_eq!(losses(&stopped).len(), 2);

    let elsewhere = tempfile::tempdir().unwrap();
    let resume = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_train"))
            .current_dir(elsewhere.path())
            .args(args)
            .output()
            .unwrap()
    };
    let refused = resume(&["--resume", ck.to_str().unwrap(), "--batch", "2"]);
    assert!(!refused.status.success());
    let lines = common::error_lines(&refused);
    assert!(
        lines.len() == 1 && lines[0].contains("used --batch/--seq-len"),
        "{lines:?}"
    );
    let out = resume(&["--resume", ck.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        common::checkpoint_names(&ck).last().unwrap(),
        "step-00000004"
    );
    assert_eq!(losses(&stopped), losses(&whole));
    assert_eq!(losses(&whole).len(), 4);
}

/// A key that is no flag, a value of the wrong type or one its flag
/// refuses, a file that is not TOML or not there: one `error:` line naming
/// the file and the key, a failure, and no checkpoint or metrics written.
#[test]
fn bad_files_are_one_error_line_and_nothing_written() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("run.toml");
    let ck = tmp.path().join("ck");
    let metrics = tmp.path().join("m.jsonl");
    let outputs = [
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--metrics",
        metrics.to_str().unwrap(),
    ];
    let name = file.display().to_string();
    for (text, expected) in [
        ("seq_len = 8", "unknown key `seq_len`"),
        (
            "steps = \"ten\"",
            "key `steps` takes an integer, not a string",
        ),
        ("lr = true", "key `lr` takes a number, not a boolean"),
        (
            "fused = 1",
            "key `fused` takes a boolean (true or false), not an integer",
        ),
        (
            "adam-betas = 0.9",
            "key `adam-betas` takes an array of numbers, not a float",
        ),
        (
            "adam-betas = [0.9, \"x\"]",
            "key `adam-betas` takes an array of numbers, not an array holding other values",
        ),
        ("[steps]", "key `steps` takes an integer, not a table"),
        ("compute = \"fp64\"", "key `compute`: invalid value 'fp64'"),
        ("steps = ", "not TOML (line 1)"),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = common::train(&["--config", &name], &outputs);
        let lines = common::error_lines(&out);
        assert!(!out.status.success(), "{text}");
        assert_eq!(lines.len(), 1, "{text}: {lines:?}");
        let prefix = format!("error: --config `{name}`: ");
        assert!(
            lines[0].starts_with(&prefix) && lines[0].contains(expected),
            "{text}: {lines:?}"
        );
        assert!(!ck.exists() && !metrics.exists(), "{text}: wrote outputs");
    }
    let missing = tmp.path().join("missing.toml");
    let out = common::train(&["--config", missing.to_str().unwrap()], &outputs);
    let lines = common::error_lines(&out);
    assert!(!out.status.success());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!(
            "error: --config `{}`: cannot read",
            missing.display()
        )),
        "{lines:?}"
    );
    assert!(!ck.exists() && !metrics.exists());
    // The saved options of --resume are held to the same rules, named as
    // that file.
    let folder = tmp.path().join("resumed");
    std::fs::create_dir_all(&folder).unwrap();
    let saved = folder.join("config.toml");
    std::fs::write(&saved, "steps = 2\nstepz = 3\n").unwrap();
    let out = common::train(&["--resume", folder.to_str().unwrap()], &outputs);
    let lines = common::error_lines(&out);
    let expected = format!("error: --resume `{}`: unknown key `stepz`", saved.display());
    assert!(!out.status.success());
    assert!(
        lines.len() == 1 && lines[0].starts_with(&expected),
        "{lines:?}"
    );
    assert!(!ck.exists() && !metrics.exists());
    assert_eq!(common::checkpoint_names(&folder), Vec::<String>::new());
}
