//! A run of several processes (`train --processes N`, and ranks started by
//! hand with `--rank/--world-size`): on the CPU build they sum gradients
//! through the rendezvous links, the stand-in for NCCL, in lane order, so N
//! processes take exactly the steps of one process with N lanes (`--gpus
//! N`), which take those of one device on the N micro-batches together.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::checkpoint_names;
use trainer::processes::free_loopback_address;

mod common;

const TINY: [&str; 6] = ["--batch", "2", "--seq-len", "16", "--sample-tokens", "0"];

fn train(args: &[&str]) -> Output {
    common::train(&TINY, args)
}

/// Each step's loss and gradient norm from a `--metrics` file, as written.
fn steps(metrics: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let loss = v.get("loss")?;
            Some((loss.to_string(), v["grad_norm"].to_string()))
        })
        .collect()
}

fn run_ok(args: &[&str]) {
    let out = train(args);
    assert!(
        out.status.success(),
        "train {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// 20 steps with clipping at 0.5, in the deferred and fused modes, for a
/// Llama (embedding looked up on the host) and a GPT-2 (embedding
/// differentiated on the device), with accumulation and in bf16: 2 and 3
/// processes match 2 and 3 lanes of one process to the bit (losses and
/// gradient norms), and one device on the batches together closely.
#[test]
fn processes_take_the_steps_of_lanes_of_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [&[&str]; 5] = [
        &["--model", "llama-tiny"],
        &["--model", "llama-tiny", "--fused"],
        &["--model", "tiny"],
        &["--model", "tiny", "--accum", "2"],
        &["--model", "llama-tiny", "--compute", "bf16"],
    ];
    for (c, case) in cases.iter().enumerate() {
        for n in [2, 3] {
            let steps_n = if c < 2 { "20" } else { "4" };
            let common = [
                case,
                &["--steps", steps_n, "--grad-clip", "0.5", "--lr", "1e-2"][..],
            ]
            .concat();
            let path = |what: &str| dir.path().join(format!("{c}-{n}-{what}.jsonl"));
            let (procs, lanes, whole) = (path("processes"), path("lanes"), path("whole"));
            let n_arg = n.to_string();
            let batch = (2 * n).to_string();
            run_ok(
                &[
                    &common[..],
                    &["--processes", &n_arg, "--metrics", procs.to_str().unwrap()],
                ]
                .concat(),
            );
            run_ok(
                &[
                    &common[..],
                    &["--gpus", &n_arg, "--metrics", lanes.to_str().unwrap()],
                ]
                .concat(),
            );
            run_ok(
                &[
                    &common[..],
                    &["--batch", &batch, "--metrics", whole.to_str().unwrap()],
                ]
                .concat(),
            );
            let (procs, lanes, whole) = (steps(&procs), steps(&lanes), steps(&whole));
            assert_eq!(procs.len(), steps_n.parse::<usize>().unwrap(), "{case:?}");
            assert_eq!(procs, lanes, "{case:?} on {n} processes against {n} lanes");
            for ((loss, _), (whole_loss, _)) in procs.iter().zip(&whole) {
                let (a, b): (f64, f64) = (loss.parse().unwrap(), whole_loss.parse().unwrap());
                let tolerance = if case.contains(&"bf16") { 2e-2 } else { 1e-4 };
                assert!(
                    (a - b).abs() <= tolerance * b.abs(),
                    "{case:?}: {procs:?} vs one device {whole:?}"
                );
            }
        }
    }
}

/// A run of two processes stopped after 3 of 6 steps and resumed from rank
/// 0's checkpoint takes the same steps, to the bit, as the run straight
/// through; the checkpoint records the world size, and a resume with
/// another is refused.
#[test]
fn a_resumed_run_of_processes_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let (full, parts) = (
        dir.path().join("full.jsonl"),
        dir.path().join("parts.jsonl"),
    );
    let base = ["--model", "llama-tiny", "--steps", "6", "--processes", "2"];
    run_ok(&[&base[..], &["--metrics", full.to_str().unwrap()]].concat());
    let ck_arg = ck.to_str().unwrap();
    let metrics = ["--metrics", parts.to_str().unwrap()];
    run_ok(
        &[
            &base[..],
            &["--checkpoint-dir", ck_arg, "--stop-after", "3"],
            &metrics,
        ]
        .concat(),
    );
    // Rank 0 alone wrote the metrics and the one checkpoint.
    assert_eq!(steps(&parts).len(), 3);
    assert_eq!(checkpoint_names(&ck), ["step-00000003"]);
    run_ok(
        &[
            &base[..],
            &["--checkpoint-dir", ck_arg, "--resume", ck_arg],
            &metrics,
        ]
        .concat(),
    );
    assert_eq!(steps(&parts), steps(&full));

    let other = train(&[
        "--model",
        "llama-tiny",
        "--steps",
        "6",
        "--processes",
        "3",
        "--resume",
        ck_arg,
    ]);
    assert!(!other.status.success());
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(
        stderr.contains("--world-size (2, 16, 1, 1, 2), not (2, 16, 1, 1, 3)"),
        "{stderr}"
    );
}

/// `train` on llama-tiny for 2 steps with `args`, under the variables `env`.
fn train_with(args: &[&str], env: &[(&str, String)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_train"));
    command
        .args(TINY)
        .args(["--model", "llama-tiny", "--steps", "2"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in common::LAUNCHER_VARIABLES {
        command.env_remove(name);
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
    command
}

fn spawn_rank(rank: usize, addr: &str, extra: &[&str]) -> Child {
    let rank = rank.to_string();
    let place = ["--rank", &rank, "--world-size", "2", "--rendezvous", addr];
    train_with(&[&place[..], extra].concat(), &[])
        .spawn()
        .expect("train starts")
}

/// Two processes placed by torchrun's variables (its agent's store holding
/// MASTER_PORT), then by srun's (the rendezvous on the first host of the
/// node list), and no rank flag, take
/// the steps of two lanes of one process to the bit; rank 0 alone writes
/// the metrics.
#[test]
fn ranks_placed_by_a_launchers_environment_take_the_steps_of_lanes() {
    let dir = tempfile::tempdir().unwrap();
    let lanes = dir.path().join("lanes.jsonl");
    let out = train_with(&["--gpus", "2", "--metrics", lanes.to_str().unwrap()], &[])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for launcher in ["torchrun", "srun"] {
        let addr = free_loopback_address().unwrap();
        let (_, port) = addr.rsplit_once(':').unwrap();
        // torchrun's agent holds MASTER_PORT for its own store.
        let _store = (launcher == "torchrun").then(|| std::net::TcpListener::bind(&addr).unwrap());
        let metrics = dir.path().join(format!("{launcher}.jsonl"));
        let ranks: Vec<Child> = (0..2)
            .map(|rank| {
                let rank = rank.to_string();
                let vars: Vec<(&str, &str)> = match launcher {
                    "torchrun" => vec![
                        ("RANK", &rank),
                        ("WORLD_SIZE", "2"),
                        ("LOCAL_RANK", &rank),
                        ("LOCAL_WORLD_SIZE", "2"),
                        ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", port),
                        ("TORCHELASTIC_RUN_ID", "none"),
                    ],
                    _ => vec![
                        ("SLURM_PROCID", &rank),
                        ("SLURM_NTASKS", "2"),
                        ("SLURM_LOCALID", &rank),
                        ("SLURM_NODEID", "0"),
                        ("SLURM_TASKS_PER_NODE", "2"),
                        ("SLURM_JOB_NODELIST", "127.0.0.[1-2]"),
                        ("MASTER_PORT", port),
                    ],
                };
                let vars: Vec<(&str, String)> =
                    vars.into_iter().map(|(k, v)| (k, v.to_string())).collect();
                train_with(&["--metrics", metrics.to_str().unwrap()], &vars)
                    .spawn()
                    .expect("train starts")
            })
            .collect();
        for rank in ranks {
            let out = rank.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{launcher}: {stderr}");
        }
        assert_eq!(steps(&metrics).len(), 2, "{launcher}");
        assert_eq!(steps(&metrics), steps(&lanes), "{launcher} against 2 lanes");
    }
}

/// A launcher's partial or malformed variables are one `error:` line naming
/// the variable, before anything is written; rank flags win over the
/// environment, and a world of one is a run of one process.
#[test]
fn a_launchers_environment_is_checked_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("m.jsonl");
    let m = ["--metrics", metrics.to_str().unwrap()];
    let refused: [(&[(&str, &str)], &str); 4] = [
        (
            &[("RANK", "0")],
            "error: environment variable WORLD_SIZE is not set, and RANK is",
        ),
        (
            &[
                ("RANK", "2"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "1"),
            ],
            "error: environment variable RANK=2 is not below WORLD_SIZE=2",
        ),
        (
            &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "two")],
            "error: environment variable SLURM_NTASKS must be a whole number, got \"two\"",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "1"),
            ],
            "error: --gpus 2 with WORLD_SIZE (torchrun's environment): a run of several",
        ),
    ];
    for (i, (vars, why)) in refused.iter().enumerate() {
        let vars: Vec<(&str, String)> = vars.iter().map(|(k, v)| (*k, v.to_string())).collect();
        let gpus: &[&str] = if i == 3 { &["--gpus", "2"] } else { &[] };
        let out = train_with(&[&m[..], gpus].concat(), &vars)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{vars:?}");
        let errors = common::error_lines(&out);
        assert!(
            errors.len() == 1 && errors[0].starts_with(why),
            "{vars:?}: {errors:?}"
        );
        assert!(!metrics.exists(), "{vars:?} wrote the metrics");
    }
    // Flags win: the launcher's ranks and one process with --rank ignore a
    // bad environment; a world of one trains alone.
    let bad = [("RANK", "x".to_string())];
    for (args, vars) in [
        (&["--processes", "2"][..], &bad[..]),
        (
            &[][..],
            &[("RANK", "0".into()), ("WORLD_SIZE", "1".into())][..],
        ),
    ] {
        let out = train_with(args, vars).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?} {vars:?}: {stderr}");
    }
}

/// Ranks started by hand meet at `--rendezvous`; ranks whose stores differ
/// (another seed) are refused before the first step, naming the rank.
#[test]
fn ranks_started_by_hand_check_that_their_stores_agree() {
    let addr = free_loopback_address().unwrap();
    let ranks = [spawn_rank(0, &addr, &[]), spawn_rank(1, &addr, &[])];
    for rank in ranks {
        let out = rank.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let addr = free_loopback_address().unwrap();
    let ranks = [
        spawn_rank(0, &addr, &[]),
        spawn_rank(1, &addr, &["--seed", "7"]),
    ];
    for rank in ranks {
        let out = rank.wait_with_output().unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(
                "rank 1's parameters (checksums of its host store) differs from rank 0's"
            ),
            "{stderr}"
        );
    }
}

/// Settings a run of processes cannot take are refused before any work,
/// and a rank that fails ends the launch with its status.
#[test]
fn impossible_runs_of_processes_are_refused() {
    let refused: [(&[&str], &str); 6] = [
        (
            &["--rendezvous", "127.0.0.1:1"],
            "--rendezvous needs --rank and --world-size",
        ),
        (
            &["--local-rank", "1"],
            "--local-rank needs --rank and --world-size",
        ),
        (
            &["--rank", "2", "--world-size", "2"],
            "--rank 2 is not below --world-size 2",
        ),
        (
            &["--rank", "0", "--world-size", "2", "--gpus", "2"],
            "trains on one GPU each",
        ),
        (
            &["--rank", "0", "--world-size", "2", "--resident"],
            "--world-size is an option of the offload engine",
        ),
        (&["--processes", "1"], "--processes must be at least 2"),
    ];
    for (args, why) in refused {
        let out = train(&[&["--steps", "1"][..], args].concat());
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
    let started = Instant::now();
    let out = train(&[
        "--steps",
        "1",
        "--processes",
        "2",
        "--resume",
        "/nonexistent/ck",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("failed"));
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// A SIGTERM to the launcher reaches every rank: they stop after the same
/// step, rank 0 writes its checkpoint, and the launcher exits as they did.
#[test]
fn a_sigterm_to_the_launcher_stops_every_rank_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, metrics) = (dir.path().join("ck"), dir.path().join("m.jsonl"));
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_train"))
        .args(TINY)
        .args([
            "--model",
            "llama-tiny",
            "--steps",
            "100000",
            "--processes",
            "2",
        ])
        .args([
            "--checkpoint-dir",
            ck.to_str().unwrap(),
            "--metrics",
            metrics.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !metrics.exists() || steps(&metrics).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no step within a minute"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(launcher.id() as libc::pid_t, libc::SIGTERM) };
    let status = launcher.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15));
    assert_eq!(checkpoint_names(&ck).len(), 1);
}
