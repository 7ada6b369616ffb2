//! `cargo xtask bench cuda`: the GPU comparison of issue 9. The rows (resident
//! burn, the engine pipelined and with serialised copies, PyTorch resident
//! with and without per-block checkpointing, FSDP2 CPU offload, per shape and
//! tokens/step) are always run by `bench/gpu/pipeline.sh`'s `bench_rows`, and
//! always reported by [`write_report`]; the commands differ in where the GPU is.
//!
//! - `run` (module `local`): on a machine with the GPU and the toolchain, in
//!   one go: builds `train`, runs the rows chosen with `--shape`, `--tokens`,
//!   `--systems`, `--precision` (pipeline.sh's `bench` part) and writes the
//!   report into `--out`.
//! - `build` is the first half of the remote flow, for a GPU machine without a
//!   Rust toolchain: it compiles and packs the CUDA binaries
//!   (`bench/gpu/binaries.sh`) and prints the device commands
//!   (`bench/gpu/pipeline.sh bench-085b ...`).
//! - `report` is its second half: it reads the files the rows leave
//!   (`bench-<shape>-<N>k-<system>` `.summary.json` for burn rows,
//!   `.torch.json` for PyTorch rows) and writes `bench.json`, `bench.md`
//!   (rows, the issue's ratios) and `bench.png`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::Serialize;

mod local;
mod report;
mod rows;

use report::write_report;
use rows::Row;

#[derive(clap::Subcommand)]
pub enum Command {
    /// On this machine's GPU: build train, run the rows, write the report.
    ///
    /// The rows run through bench/gpu/pipeline.sh, whose knobs in the
    /// environment apply (LIMIT_ROW, LIMIT_PEER, BENCH_STEPS, RESIDENT_BATCH, MATMUL,
    /// TAG, ARGS, ...); the report's command line quotes the ones set.
    Run(local::RunArgs),
    /// Build and pack the CUDA binaries for a remote GPU machine; print the
    /// device commands.
    Build,
    /// Turn a results folder of the GPU rows into JSON, markdown and a plot.
    Report(ReportArgs),
}

#[derive(clap::Args)]
pub struct ReportArgs {
    /// Folder with the rows' files (the unpacked `results.tgz`).
    #[arg(long)]
    results: PathBuf,
    /// Where to write bench.json, bench.md and bench.png.
    #[arg(long)]
    out: PathBuf,
    /// The command that produced the rows, quoted in the markdown.
    #[arg(long, default_value = "")]
    command: String,
    /// A TrueType font for the plot's text.
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    font: PathBuf,
}

pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Build => {
            let status = std::process::Command::new("bash")
                .arg("bench/gpu/binaries.sh")
                .env("TRAIN_PACKAGE", local::TRAIN_PACKAGE)
                .status()
                .context("cannot run bench/gpu/binaries.sh")?;
            if !status.success() {
                bail!("bench/gpu/binaries.sh failed ({status})");
            }
            println!(
                "packed .device/bin.tar.xz; on the GPU machine (device tool, carry .device/bin.tar.xz):\n  \
                 bash bench/gpu/pipeline.sh parity bench-085b\n  \
                 bash bench/gpu/pipeline.sh bench-085b-peers bench-3b\n  \
                 bash bench/gpu/pipeline.sh bench-bf16    (then bench-bf16-peers, bench-3b-bf16)\n  \
                 HOST_GIB=125 bash bench/gpu/pipeline.sh bench-7b    (7B at 64k: compact, 8-bit state, fused, PyTorch FSDP2 offload)\n  \
                 HOST_GIB=125 bash bench/gpu/pipeline.sh largest    (the largest Llama-3-8B-wide model; LARGEST_STATE=8bit for 8-bit Adam)\n  \
                 on a machine with 2 GPUs: bash bench/gpu/pipeline.sh parity-dp bench-gpus-085b; HOST_GIB=250 bash bench/gpu/pipeline.sh bench-gpus-7b    (1 and 2 GPUs, GPUS=\"1 2\")\n  \
                 or any selection: SHAPES=\"085b 3b\" BENCH_TOKENS=\"4 16\" SYSTEMS=\"pipelined serial\" bash bench/gpu/pipeline.sh bench\n\
                 then: cargo xtask bench cuda report --results <unpacked results.tgz> --out bench/results/<run>"
            );
            Ok(())
        }
        Command::Run(args) => local::run(&args),
        Command::Report(args) => {
            write_report(&args.results, &args.out, &args.command, &[], &args.font)
        }
    }
}

/// Display order of the systems; the first six are the default selection.
const SYSTEMS: [&str; 10] = [
    "resident",
    "pipelined",
    "serial",
    "torch-resident",
    "torch-ckpt",
    "torch-fsdp2",
    "compact",
    "compact8",
    "fused",
    "megatrain",
];

/// `<base>[-bf16][-old]` → (base, bf16, earlier build).
/// `system[@kernel]`: a burn row run with `train --matmul <kernel>`
/// (`MATMUL=<kernel>` in pipeline.sh) names the kernel after an `@`.
fn split_kernel(system: &str) -> (&str, Option<&str>) {
    match system.split_once('@') {
        Some((system, kernel)) => (system, Some(kernel)),
        None => (system, None),
    }
}

/// `<system>-x<N>`: an engine row on N GPUs (`train --gpus N`, the tokens
/// per step per GPU) → (system, N); other rows run on one.
fn split_gpus(system: &str) -> (&str, usize) {
    let (name, kernel) = split_kernel(system);
    let Some((base, n)) = name.rsplit_once("-x") else {
        return (system, 1);
    };
    match (n.parse::<usize>(), kernel) {
        (Ok(n), None) if n > 1 => (base, n),
        // The kernel label stays with the row; the system is named without it.
        (Ok(n), Some(_)) if n > 1 => (base, n),
        _ => (system, 1),
    }
}

fn split_system(system: &str) -> (&str, bool, bool) {
    let (system, _) = split_kernel(system);
    let (system, _) = split_gpus(system);
    let (rest, old) = match system.strip_suffix("-old") {
        Some(rest) => (rest, true),
        None => (system, false),
    };
    match rest.strip_suffix("-bf16") {
        Some(base) => (base, true, old),
        None => (rest, false, old),
    }
}

/// fp32 rows first, then bf16, each in [`SYSTEMS`] order.
fn system_rank(system: &str) -> (usize, String) {
    let (base, bf16, _) = split_system(system);
    let rank = SYSTEMS
        .iter()
        .position(|s| *s == base)
        .unwrap_or(SYSTEMS.len());
    (
        rank + usize::from(bf16) * (SYSTEMS.len() + 1),
        system.to_string(),
    )
}

fn label(system: &str) -> String {
    let (base, bf16, old) = split_system(system);
    let precision = if bf16 { " bf16" } else { "" };
    let old = if old { " (earlier build)" } else { "" };
    let name = match base {
        "resident" => "burn resident (Autodiff)",
        "pipelined" => "burn-offload pipelined",
        "serial" => "burn-offload serialised copies",
        "torch-resident" => "PyTorch resident",
        "torch-ckpt" => "PyTorch resident + checkpointing",
        "torch-fsdp2" => "PyTorch FSDP2 CPU offload",
        "compact" => "burn-offload compact host layout",
        "compact8" => "burn-offload compact, 8-bit Adam state",
        "fused" => "burn-offload fused (two backwards with clipping)",
        other => other,
    };
    let kernel = match split_kernel(system).1 {
        Some(kernel) => format!(" @{kernel}"),
        None => String::new(),
    };
    let gpus = match split_gpus(split_kernel(system).0).1 {
        1 => String::new(),
        n => format!(" on {n} GPUs"),
    };
    format!("{name}{precision}{old}{gpus}{kernel}")
}

/// A ratio of two rows' tokens/s at one shape and tokens/step, with its target.
#[derive(Debug, Serialize)]
struct Ratio {
    shape: String,
    tokens_per_step: u64,
    what: String,
    value: f64,
    target: Option<f64>,
}

fn ratios(rows: &[Row]) -> Vec<Ratio> {
    const PAIRS: [(&str, &str, &str, Option<f64>); 17] = [
        (
            "pipelined",
            "resident",
            "offload ÷ resident burn",
            Some(0.9),
        ),
        ("pipelined", "serial", "pipelined ÷ serialised", Some(1.3)),
        (
            "pipelined",
            "torch-fsdp2",
            "ours ÷ PyTorch FSDP2 offload",
            Some(1.4),
        ),
        (
            "pipelined",
            "torch-ckpt",
            "ours ÷ PyTorch checkpointed",
            Some(0.9),
        ),
        (
            "pipelined",
            "pipelined-old",
            "this build ÷ earlier build (pipelined)",
            None,
        ),
        (
            "resident",
            "resident-old",
            "this build ÷ earlier build (resident)",
            None,
        ),
        // Issue 7: bf16 compute, fp32 master weights.
        (
            "pipelined-bf16",
            "resident-bf16",
            "bf16 offload ÷ bf16 resident burn",
            Some(0.85),
        ),
        (
            "pipelined-bf16",
            "torch-fsdp2-bf16",
            "bf16 ours ÷ PyTorch FSDP2 offload bf16",
            Some(2.0),
        ),
        (
            "pipelined-bf16",
            "torch-ckpt-bf16",
            "bf16 ours ÷ PyTorch checkpointed bf16",
            None,
        ),
        (
            "pipelined-bf16",
            "serial-bf16",
            "pipelined ÷ serialised (bf16)",
            None,
        ),
        (
            "pipelined-bf16",
            "pipelined",
            "bf16 ÷ fp32 (pipelined)",
            None,
        ),
        (
            "resident-bf16",
            "resident",
            "bf16 ÷ fp32 (resident burn)",
            None,
        ),
        // Issue 36: exact clipping with one backward against the fused
        // mode's two, and the cost of 8-bit Adam state.
        (
            "compact-bf16",
            "fused-bf16",
            "compact (one backward) ÷ fused (two)",
            Some(1.6),
        ),
        (
            "compact8-bf16",
            "compact-bf16",
            "8-bit ÷ fp32 Adam state (compact)",
            None,
        ),
        (
            "compact-bf16",
            "torch-fsdp2-bf16",
            "compact ÷ PyTorch FSDP2 offload bf16",
            None,
        ),
        // Issue 54: the 7B against MegaTrain's own engine.
        (
            "compact-bf16",
            "megatrain-bf16",
            "compact ÷ MegaTrain's engine bf16",
            Some(2.0),
        ),
        (
            "pipelined-bf16",
            "megatrain-bf16",
            "bf16 ours ÷ MegaTrain's engine",
            None,
        ),
    ];
    let tok = |shape: &str, tokens: u64, system: &str| {
        rows.iter()
            .find(|r| r.shape == shape && r.tokens_per_step == tokens && r.system == system)
            .and_then(|r| r.tok_s)
    };
    let mut keys: Vec<(String, u64)> = rows
        .iter()
        .map(|r| (r.shape.clone(), r.tokens_per_step))
        .collect();
    keys.dedup();
    let mut out = Vec::new();
    for (shape, tokens) in keys {
        for (a, b, what, target) in PAIRS {
            if let (Some(x), Some(y)) = (tok(&shape, tokens, a), tok(&shape, tokens, b)) {
                out.push(Ratio {
                    shape: shape.clone(),
                    tokens_per_step: tokens,
                    what: what.into(),
                    value: x / y,
                    target,
                });
            }
        }
        // Issue 39: an engine row on N GPUs against the same row on one,
        // the tokens per step per GPU: N-GPU tok/s ÷ (N × 1-GPU tok/s).
        for row in rows
            .iter()
            .filter(|r| r.shape == shape && r.tokens_per_step == tokens)
        {
            let (name, kernel) = split_kernel(&row.system);
            let (system, n) = split_gpus(name);
            if n == 1 {
                continue;
            }
            let one = match kernel {
                Some(kernel) => format!("{system}@{kernel}"),
                None => system.to_string(),
            };
            if let (Some(x), Some(y)) = (row.tok_s, tok(&shape, tokens, &one)) {
                out.push(Ratio {
                    shape: shape.clone(),
                    tokens_per_step: tokens,
                    what: format!("scaling efficiency on {n} GPUs ({})", label(&one)),
                    value: x / (n as f64 * y),
                    // Issue 39's target is for two GPUs.
                    target: (n == 2).then_some(0.85),
                });
            }
        }
        // A variant (`@<label>`: `--matmul <kernel>`, or the flags of
        // pipeline.sh's TAG/ARGS) against the same system's default row.
        for row in rows
            .iter()
            .filter(|r| r.shape == shape && r.tokens_per_step == tokens)
        {
            let (system, Some(kernel)) = split_kernel(&row.system) else {
                continue;
            };
            if let (Some(x), Some(y)) = (row.tok_s, tok(&shape, tokens, system)) {
                out.push(Ratio {
                    shape: shape.clone(),
                    tokens_per_step: tokens,
                    what: format!("@{kernel} ÷ default ({})", label(system)),
                    value: x / y,
                    target: None,
                });
            }
        }
        // Resident burn keeps every activation and stops fitting as tokens
        // per step grow; the offload row is then compared with resident
        // burn's best, at the most tokens per step that fit.
        for (ours, resident, what, target) in [
            ("pipelined", "resident", "offload ÷ resident burn", 0.9),
            (
                "pipelined-bf16",
                "resident-bf16",
                "bf16 offload ÷ bf16 resident burn",
                0.85,
            ),
        ] {
            let (Some(x), None) = (tok(&shape, tokens, ours), tok(&shape, tokens, resident)) else {
                continue;
            };
            let fits = rows
                .iter()
                .filter(|r| r.shape == shape && r.system == resident && r.tokens_per_step < tokens)
                .filter_map(|r| Some((r.tokens_per_step, r.tok_s?)))
                .max_by_key(|(t, _)| *t);
            if let Some((t, y)) = fits {
                out.push(Ratio {
                    shape: shape.clone(),
                    tokens_per_step: tokens,
                    what: format!("{what} at {t} tokens/step (the most that fits)"),
                    value: x / y,
                    target: Some(target),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::report::{gpu_name, markdown, plot};
    use super::rows::{parse_name, read_rows};
    use super::*;

    #[test]
    fn row_names_parse() {
        assert_eq!(
            parse_name("bench-085b-16k-torch-fsdp2"),
            Some(("085b".into(), 16384, "torch-fsdp2".into()))
        );
        assert_eq!(
            parse_name("bench-3b-4k-pipelined-old"),
            Some(("3b".into(), 4096, "pipelined-old".into()))
        );
        assert_eq!(
            parse_name("bench-085b-16k-pipelined-bf16@matmul_simple_tma_mma"),
            Some((
                "085b".into(),
                16384,
                "pipelined-bf16@matmul_simple_tma_mma".into()
            ))
        );
        assert_eq!(
            split_system("pipelined-bf16@matmul_simple_tma_mma"),
            ("pipelined", true, false)
        );
        assert_eq!(
            label("pipelined-bf16@matmul_simple_tma_mma"),
            "burn-offload pipelined bf16 @matmul_simple_tma_mma"
        );
        assert_eq!(
            split_system("pipelined-old@chunk16k"),
            ("pipelined", false, true)
        );
        assert_eq!(split_gpus("compact-bf16-x2"), ("compact-bf16", 2));
        assert_eq!(split_gpus("pipelined-x2@tag"), ("pipelined", 2));
        assert_eq!(split_gpus("torch-fsdp2"), ("torch-fsdp2", 1));
        assert_eq!(
            split_system("pipelined-bf16-x4"),
            ("pipelined", true, false)
        );
        assert_eq!(label("pipelined-x2"), "burn-offload pipelined on 2 GPUs");
        assert_eq!(parse_name("bench-3b-four-pipelined"), None);
        assert_eq!(parse_name("085b-16k-serial"), None);
    }

    #[test]
    fn report_from_rows() {
        let dir = std::env::temp_dir().join(format!("xtask-report-{}", std::process::id()));
        let results = dir.join("results");
        fs::create_dir_all(&results).unwrap();
        let burn = |tok: f64| {
            serde_json::json!({"tok_s_median": tok, "step_s_median": 16384.0 / tok, "gpu_peak_mib": 8192,
                "host_peak_gib": 15.5, "h2d_forward_gb_s": 50.0,
                "split_median_s": {"forward_s": 1.0, "backward_s": 3.0, "forward_h2d_copy_s": 0.1}})
            .to_string()
        };
        fs::write(
            results.join("bench-085b-16k-pipelined.summary.json"),
            burn(4000.0),
        )
        .unwrap();
        fs::write(
            results.join("bench-085b-16k-serial.summary.json"),
            burn(2000.0),
        )
        .unwrap();
        fs::write(
            results.join("bench-085b-16k-resident.summary.json"),
            r#"{"steps": 0, "gpu_peak_mib": 80000}"#,
        )
        .unwrap();
        fs::write(
            results.join("bench-085b-16k-resident.tail"),
            "CUDA_ERROR_OUT_OF_MEMORY\n",
        )
        .unwrap();
        fs::write(
            results.join("bench-085b-4k-resident.summary.json"),
            burn(5000.0),
        )
        .unwrap();
        // Killed before its summary was written: an empty file.
        fs::write(results.join("bench-085b-4k-pipelined.summary.json"), "").unwrap();
        fs::write(
            results.join("bench-085b-4k-pipelined.tail"),
            "error: not enough GPU memory: needs 213 GiB\nCommand exited with non-zero status 1\n",
        )
        .unwrap();
        fs::write(
            results.join("bench-085b-16k-torch-fsdp2.torch.json"),
            r#"{"ok": true, "tok_s_median": 3200.0, "model_tflops": 16.0}"#,
        )
        .unwrap();
        fs::write(results.join("bench-085b-16k-torch-fsdp2.smi"), "16384\n").unwrap();
        fs::write(
            results.join("bench-085b-16k-pipelined-bf16.summary.json"),
            burn(8000.0),
        )
        .unwrap();
        fs::write(
            results.join("bench-085b-16k-torch-fsdp2-bf16.torch.json"),
            r#"{"ok": true, "tok_s_median": 3200.0, "model_tflops": 16.0}"#,
        )
        .unwrap();
        fs::write(results.join("bench-085b-16k-torch-ckpt.torch.json"), "").unwrap();
        fs::write(
            results.join("bench-085b-16k-pipelined-bf16@matmul_simple_tma_mma.summary.json"),
            burn(12000.0),
        )
        .unwrap();
        fs::write(
            results.join("bench-085b-16k-pipelined-bf16-x2.summary.json"),
            burn(14400.0),
        )
        .unwrap();
        let rows = read_rows(&results).unwrap();
        assert_eq!(rows.len(), 11);
        assert_eq!(rows[0].system, "resident");
        assert!(rows[0].ok);
        assert_eq!(rows[1].system, "pipelined");
        assert_eq!(
            rows[1].note.as_deref(),
            Some("error: not enough GPU memory: needs 213 GiB")
        );
        assert_eq!(rows[2].system, "resident");
        assert!(!rows[2].ok);
        assert_eq!(rows[2].note.as_deref(), Some("out of GPU memory"));
        assert!(!rows.iter().find(|r| r.system == "torch-ckpt").unwrap().ok);
        let fsdp = rows.iter().find(|r| r.system == "torch-fsdp2").unwrap();
        assert_eq!(fsdp.gpu_peak_gib, Some(16.0));
        let q = ratios(&rows);
        let get = |what: &str| q.iter().find(|r| r.what == what).map(|r| r.value);
        assert_eq!(get("pipelined ÷ serialised"), Some(2.0));
        assert_eq!(get("ours ÷ PyTorch FSDP2 offload"), Some(1.25));
        assert_eq!(get("offload ÷ resident burn"), None);
        assert_eq!(get("bf16 ours ÷ PyTorch FSDP2 offload bf16"), Some(2.5));
        assert_eq!(get("bf16 ÷ fp32 (pipelined)"), Some(2.0));
        assert_eq!(
            get("scaling efficiency on 2 GPUs (burn-offload pipelined bf16)"),
            Some(0.9)
        );
        let order: Vec<&str> = rows
            .iter()
            .filter(|r| r.tokens_per_step == 16384)
            .map(|r| r.system.as_str())
            .collect();
        assert_eq!(
            order,
            [
                "resident",
                "pipelined",
                "serial",
                "torch-ckpt",
                "torch-fsdp2",
                "pipelined-bf16",
                "pipelined-bf16-x2",
                "pipelined-bf16@matmul_simple_tma_mma",
                "torch-fsdp2-bf16"
            ]
        );
        assert_eq!(
            get("@matmul_simple_tma_mma ÷ default (burn-offload pipelined bf16)"),
            Some(1.5)
        );
        assert_eq!(
            get("offload ÷ resident burn at 4096 tokens/step (the most that fits)"),
            Some(0.8)
        );
        let md = markdown(&rows, &q, "cmd", &[]);
        assert!(md.contains("| 085b | 16384 | burn resident (Autodiff) | out of GPU memory |"));
        assert!(md.contains("| 085b | 16384 | PyTorch FSDP2 CPU offload bf16 |"));
        assert!(md.contains("| pipelined ÷ serialised | 2.00 | ≥ 1.3 | yes |"));
        assert!(!md.contains("forward_h2d_copy"));
        let noted = markdown(
            &rows,
            &q,
            "cmd",
            &["PyTorch peer rows skipped: no torch".into()],
        );
        assert!(noted.contains("Command: `cmd`\n\nNote: PyTorch peer rows skipped: no torch.\n"));
        // The plot needs a font; CI machines may have none, so it is exercised
        // only where the default one exists.
        assert_eq!(gpu_name(&dir), "GPU");
        fs::write(dir.join("gpu.txt"), "NVIDIA H200, 143771 MiB, 580.159.04\n").unwrap();
        assert_eq!(gpu_name(&dir), "NVIDIA H200");
        let font = PathBuf::from("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf");
        if font.exists() {
            plot(&rows, &gpu_name(&dir), &dir.join("bench.png"), &font).unwrap();
            assert!(fs::metadata(dir.join("bench.png")).unwrap().len() > 1000);
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
