//! LoRA from the command line (`--lora-rank`, resident or on the offload
//! engine with its base frozen in host memory): only the adapted
//! projections change, `--export-peft` writes adapters that give the merged
//! `--export-hf` model's logits on the base, and bad LoRA input is refused
//! before any work.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn_offload::BlockModel;
use common::{error_lines, llama3_checkpoint, metrics, train};
use models::{Llama, ModelConfig};
use trainer::DefaultBackend as B;

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn corpus(dir: &Path) -> PathBuf {
    let path = dir.join("train.txt");
    std::fs::write(
        &path,
        "the quick brown fox jumps over the lazy dog. ".repeat(40),
    )
    .unwrap();
    path
}

/// The Llama checkpoint of an HF folder, on the CPU.
fn load(dir: &Path) -> Llama<B> {
    let device = Default::default();
    let config = models::hf::load_config(dir).unwrap();
    let ModelConfig::Llama(c) = &config else {
        panic!("a Llama folder")
    };
    models::hf::load_weights(c.init::<B>(&device), &config, dir).unwrap()
}

/// Every float parameter's path and values, in visit order.
fn values<M: Module<B>>(model: &M) -> Vec<(String, Vec<f32>)> {
    struct Values {
        path: Vec<String>,
        out: Vec<(String, Vec<f32>)>,
    }
    impl ModuleVisitor<B> for Values {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.into());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let data = param.val().into_data().convert::<f32>();
            self.out
                .push((self.path.join("."), data.to_vec::<f32>().unwrap()));
        }
    }
    let mut visitor = Values {
        path: Vec::new(),
        out: Vec::new(),
    };
    model.visit(&mut visitor);
    visitor.out
}

fn logits(model: &Llama<B>) -> Tensor<B, 3> {
    let tokens: Vec<i64> = (0..24).map(|i| (i * 37 % 600) as i64).collect();
    let tokens =
        Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [2, 12]), &Default::default());
    model.forward(tokens)
}

#[test]
fn a_lora_run_changes_only_its_targets_and_its_files_agree() {
    let (_dir, ck, adapters, merged) = lora_run(&["--resident"]);
    // `chat --adapter` merges the adapters as they load: the merged
    // export's greedy reply, token for token.
    let chat = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_chat"))
            .args(args)
            .args([
                "--temperature",
                "0",
                "--max-new-tokens",
                "16",
                "--prompt",
                "Hi.",
            ])
            .output()
            .expect("chat runs")
    };
    let (from_merged, from_adapter) = (
        chat(&[s(&merged)]),
        chat(&[s(&ck), "--adapter", s(&adapters)]),
    );
    ok(&from_merged);
    ok(&from_adapter);
    assert_eq!(from_adapter.stdout, from_merged.stdout);
    let from_base = chat(&[s(&ck)]);
    ok(&from_base);
    assert_ne!(
        from_base.stdout, from_merged.stdout,
        "training changed the reply"
    );
    // Streamed from host memory, the adapters merge into the store as the
    // checkpoint's tensors are read.
    let streamed = chat(&[s(&ck), "--adapter", s(&adapters), "--streamed"]);
    ok(&streamed);
    assert_eq!(streamed.stdout, from_merged.stdout);
    // No adapters there: one line, no reply.
    let out = chat(&[s(&ck), "--adapter", s(&ck)]);
    assert!(!out.status.success());
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("--adapter: "), "{}", errors[0]);
    assert!(out.stdout.is_empty());
}

/// The same on the type parameter (`Autodiff<Offload<B>>` with the host
/// AdamW): the frozen base gets no gradient, so the host optimizer never
/// updates it.
#[test]
fn a_lora_run_on_the_type_parameter_changes_only_its_targets() {
    lora_run(&["--resident", "--host-params"]);
}

/// The offload engine with the base frozen in host memory in f32.
#[test]
fn a_lora_run_on_the_offload_engine_changes_only_its_targets() {
    lora_run(&["--base-dtype", "f32"]);
}

/// QLoRA: the engine holds the base in bf16 (fused), NF4 or int8; the
/// adapters learn on it and load onto the original model.
#[test]
fn a_lora_run_on_a_bf16_or_quantised_base_learns() {
    for dtype in ["bf16", "nf4", "int8"] {
        let dir = tempfile::tempdir().unwrap();
        let ck = llama3_checkpoint(dir.path());
        let data = corpus(dir.path());
        let (adapters, jsonl) = (dir.path().join("adapters"), dir.path().join("m.jsonl"));
        let mut args = run_args(&ck, &data, &adapters, &jsonl);
        args.extend(["--base-dtype", dtype].map(String::from));
        if dtype == "bf16" {
            args.push("--fused".into());
        }
        let out = train(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        ok(&out);
        learned(&jsonl);
        let adapted = models::load_peft(load(&ck), &adapters).unwrap();
        let moved: f32 = (logits(&adapted) - logits(&load(&ck)))
            .abs()
            .max()
            .into_scalar();
        assert!(moved > 1e-4, "{dtype}: training moved the logits: {moved}");
        if dtype == "bf16" {
            continue;
        }
        // A merge would write the dequantised base: refused.
        args.extend(["--export-hf", "x", "--merge-lora"].map(String::from));
        let out = train(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        assert!(!out.status.success());
        let errors = error_lines(&out);
        assert!(errors[0].contains("--merge-lora"), "{errors:?}");
    }
}

/// The flags of a 12-step LoRA run from `ck` on `data` writing its
/// adapters and metrics.
fn run_args(ck: &Path, data: &Path, adapters: &Path, jsonl: &Path) -> Vec<String> {
    [
        "--init-from",
        s(ck),
        "--data",
        s(data),
        "--steps",
        "12",
        "--warmup",
        "1",
        "--batch",
        "2",
        "--seq-len",
        "16",
        "--lr",
        "1e-2",
        "--lora-rank",
        "4",
        "--lora-alpha",
        "8",
        "--lora-targets",
        "q_proj,v_proj,down_proj",
        "--export-peft",
        s(adapters),
        "--sample-tokens",
        "0",
        "--metrics",
        s(jsonl),
    ]
    .map(String::from)
    .to_vec()
}

/// The run's 12 losses are finite and fall.
fn learned(jsonl: &Path) {
    let losses: Vec<f64> = metrics(jsonl)
        .iter()
        .filter_map(|l| l["loss"].as_f64())
        .collect();
    assert_eq!(losses.len(), 12);
    assert!(losses.iter().all(|l| l.is_finite()));
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    assert!(
        mean(&losses[9..]) < mean(&losses[..3]) - 0.5,
        "the adapters learn: {losses:?}"
    );
}

/// Trains adapters with `extra` flags and checks the run's outputs: the
/// run's folder, the checkpoint, the adapters and the merged export.
fn lora_run(extra: &[&str]) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ck = llama3_checkpoint(dir.path());
    let data = corpus(dir.path());
    let (adapters, merged, jsonl) = (
        dir.path().join("adapters"),
        dir.path().join("merged"),
        dir.path().join("m.jsonl"),
    );
    let mut args = run_args(&ck, &data, &adapters, &jsonl);
    args.extend(["--export-hf", s(&merged), "--merge-lora"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = train(extra, &args);
    ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("adapters: "), "{stdout}");
    learned(&jsonl);

    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapters.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["r"], 4);
    assert_eq!(config["lora_alpha"], 8.0);
    assert_eq!(config["peft_type"], "LORA");

    // The merged model differs from the base exactly in the targets.
    let (base, merged_model) = (load(&ck), load(&merged));
    for ((name, before), (merged_name, after)) in values(&base).iter().zip(values(&merged_model)) {
        assert_eq!(name, &merged_name);
        // The weights of the targets (their biases stay frozen).
        let target = ["q_proj", "v_proj", "down_proj"]
            .iter()
            .any(|t| name.contains(t))
            && name.ends_with("weight");
        let changed = before != &after;
        assert_eq!(changed, target, "{name}: changed {changed}");
    }

    // The base with the exported adapters is the merged model.
    let adapted = models::load_peft(load(&ck), &adapters).unwrap();
    let (a, b) = (logits(&adapted), logits(&merged_model));
    let diff: f32 = (a.clone() - b).abs().max().into_scalar();
    assert!(diff < 1e-4, "adapters against merged: {diff}");
    let moved: f32 = (a - logits(&base)).abs().max().into_scalar();
    assert!(moved > 1e-4, "training moved the logits: {moved}");
    (dir, ck, adapters, merged)
}

#[test]
fn bad_lora_input_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let ck = llama3_checkpoint(dir.path());
    let data = corpus(dir.path());
    let base = [
        "--init-from",
        s(&ck),
        "--data",
        s(&data),
        "--steps",
        "1",
        "--batch",
        "1",
        "--seq-len",
        "8",
    ];
    let weights = std::fs::read(ck.join("model.safetensors")).unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--lora-rank", "4", "--lora-dropout", "0.1"],
            "--lora-dropout needs --resident",
        ),
        (
            &["--resident", "--lora-rank", "4", "--lora-targets", "c_attn"],
            "--lora-targets: LoRA target `c_attn` names no projection of a Llama-family model",
        ),
        (
            &["--resident", "--lora-rank", "4", "--lora-targets", "qproj"],
            "--lora-targets: unknown LoRA target `qproj`",
        ),
        (
            &["--lora-alpha", "16"],
            "--lora-alpha applies to LoRA adapters",
        ),
        (
            &["--resident", "--lora-rank", "4", "--export-peft", s(&ck)],
            "--export-peft",
        ),
    ];
    for (args, said) in cases {
        let out = train(&base, args);
        assert!(!out.status.success(), "{args:?}");
        let errors = error_lines(&out);
        assert_eq!(errors.len(), 1, "{args:?}: {errors:?}");
        assert!(errors[0].contains(said), "{args:?}: {}", errors[0]);
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("step 1"),
            "{args:?} trained"
        );
    }
    assert_eq!(
        std::fs::read(ck.join("model.safetensors")).unwrap(),
        weights
    );
    assert_eq!(
        std::fs::read_dir(&ck).unwrap().count(),
        5,
        "nothing written into the checkpoint"
    );

    // A base quantised by another tool holds codes, not values: quantising
    // them again to NF4 would be wrong, so the run stops at the config.
    let config_path = ck.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["quantization_config"] = serde_json::json!({"quant_method": "gptq", "bits": 4});
    std::fs::write(&config_path, config.to_string()).unwrap();
    let out = train(&base, &["--lora-rank", "4", "--base-dtype", "nf4"]);
    assert!(!out.status.success());
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("pre-quantised weights (`quantization_config`: gptq 4-bit)"),
        "{}",
        errors[0]
    );
    assert_eq!(std::fs::read_dir(&ck).unwrap().count(), 5);
}

/// An engine LoRA run's checkpoints hold the adapters and their state, not
/// the base: a run stopped after 6 steps and resumed ends where the
/// uninterrupted one does, and a resume with other adapters is refused.
#[test]
fn an_engine_lora_run_resumes_from_an_adapter_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ck = llama3_checkpoint(dir.path());
    let data = corpus(dir.path());
    let run = |name: &str, more: &[&str]| {
        let (adapters, jsonl) = (
            dir.path().join(name),
            dir.path().join(format!("{name}.jsonl")),
        );
        let mut args = run_args(&ck, &data, &adapters, &jsonl);
        args.extend(["--base-dtype", "nf4"].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (train(&args, more), jsonl)
    };
    let (straight, straight_jsonl) = run("straight", &[]);
    ok(&straight);
    let checkpoints = dir.path().join("checkpoints");
    let (first, _) = run(
        "first",
        &["--stop-after", "6", "--checkpoint-dir", s(&checkpoints)],
    );
    ok(&first);
    // No base-sized file: the fixture's weights are ~1 MB, the adapters' state far less.
    let bytes: u64 = walk(&checkpoints)
        .iter()
        .map(|p| p.metadata().unwrap().len())
        .sum();
    let base = std::fs::metadata(ck.join("model.safetensors"))
        .unwrap()
        .len();
    assert!(bytes < base / 4, "checkpoint of {bytes} bytes, base {base}");
    let (resumed, resumed_jsonl) = run("resumed", &["--resume", s(&checkpoints)]);
    ok(&resumed);
    let losses = |p: &Path| -> Vec<f64> {
        metrics(p)
            .iter()
            .filter_map(|l| l["loss"].as_f64())
            .collect()
    };
    let (want, got) = (losses(&straight_jsonl), losses(&resumed_jsonl));
    assert_eq!(got.len(), 6);
    for (a, b) in want[6..].iter().zip(&got) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{want:?} vs {got:?}");
    }
    let (other, _) = run(
        "other",
        &["--resume", s(&checkpoints), "--lora-alpha", "16"],
    );
    assert!(!other.status.success());
    let errors = error_lines(&other);
    assert!(errors[0].contains("holds LoRA adapters of"), "{errors:?}");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
