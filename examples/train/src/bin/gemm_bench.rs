//! Matmul throughput of burn's CUDA backend per cubek strategy, on the
//! shapes of the 0.85B bench block at 16k tokens (bench/gpu/gemm.sh).
//!
//! The engine's GPU time is ~70% matmul (Nsight Compute, bench/gpu/profile.sh),
//! and burn 0.21 without autotune launches every matmul with cubek's `Auto`
//! strategy. This binary times each strategy that burn's autotuner would try,
//! for the forward and both backward layouts (an operand transposed by
//! `swap_dims`, as autodiff produces it), in fp32 and bf16, so the choice of a
//! fixed strategy (or of another GEMM) rests on numbers from the H100.
//!
//! Output: one JSON object per line (shape, dtype, strategy, TFLOPS or the
//! error), on stdout.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use burn::tensor::{DType, Distribution, Tensor};
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::cubecl::future::block_on;
use burn_cubecl::tensor::CubeTensor;
use burn_offload::cuda_backend::CudaBackend;
use clap::Parser;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::std::InputBinding;

#[derive(Parser)]
#[command(about = "Times cubek matmul strategies on the bench block's shapes")]
struct Cli {
    /// Tokens per step (rows of the activations).
    #[arg(long, default_value_t = 16384)]
    tokens: usize,
    /// Timed launches per strategy (after one untimed launch that compiles).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Stop starting new cases after this many seconds.
    #[arg(long, default_value_t = 200.0)]
    budget_s: f64,
    /// Data types to time.
    #[arg(long, value_delimiter = ',', default_value = "bf16,f32")]
    dtypes: Vec<String>,
    /// Time only these cubek strategies (names as `--matmul` takes them;
    /// `auto` is burn's default); all of them when empty.
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    /// Also time cuBLAS as `--matmul cublas` launches it (needs libcublas on
    /// LD_LIBRARY_PATH).
    #[arg(long)]
    cublas: bool,
}

/// One matmul of the block: `[m, k] @ [k, n]`, with the operand that autodiff
/// hands over transposed built as a `swap_dims` view.
struct Case {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    lhs_transposed: bool,
    rhs_transposed: bool,
}

/// burn's default (`Auto`) first, then every strategy `--matmul` accepts.
fn strategies() -> Vec<Strategy> {
    std::iter::once(Strategy::Auto)
        .chain(burn_offload::cuda_backend::matmul_strategies())
        .collect()
}

fn operand(rows: usize, cols: usize, transposed: bool, dtype: DType) -> CubeTensor<CudaRuntime> {
    let device = CudaDevice { index: 0 };
    let shape = if transposed {
        [cols, rows]
    } else {
        [rows, cols]
    };
    let t = Tensor::<CudaBackend, 2>::random(shape, Distribution::Default, &device).cast(dtype);
    let t = if transposed { t.swap_dims(0, 1) } else { t };
    t.into_primitive().tensor()
}

/// Launches `strategy` once (compiling it), then `reps` times; TFLOPS of the
/// timed launches, or why the strategy does not run on this case.
fn time(
    strategy: &Strategy,
    lhs: &CubeTensor<CudaRuntime>,
    rhs: &CubeTensor<CudaRuntime>,
    out: &CubeTensor<CudaRuntime>,
    flops: f64,
    reps: usize,
) -> Result<f64, String> {
    let client = &out.client;
    let launch = || -> Result<(), String> {
        let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
            lhs: lhs.dtype.into(),
            rhs: rhs.dtype.into(),
            out: out.dtype.into(),
        });
        let run = catch_unwind(AssertUnwindSafe(|| {
            launch_ref(
                strategy,
                client,
                InputBinding::new(lhs.clone().binding(), lhs.dtype.into()),
                InputBinding::new(rhs.clone().binding(), lhs.dtype.into()),
                out.clone().binding(),
                &mut dtypes,
            )
        }));
        match run {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("{e:?}")),
            Err(_) => Err("panicked".into()),
        }
    };
    launch()?;
    block_on(client.sync()).map_err(|e| format!("{e:?}"))?;
    let start = Instant::now();
    for _ in 0..reps {
        launch()?;
    }
    block_on(client.sync()).map_err(|e| format!("{e:?}"))?;
    Ok(flops * reps as f64 / start.elapsed().as_secs_f64() / 1e12)
}

/// As [`time`], for cuBLAS as `Gemm<Cuda>` launches it: on cubecl's stream,
/// nothing waited for until the final sync.
/// With `tf32`, f32 goes through TF32 tensor-core math, as `--matmul
/// cublas-tf32` launches it.
fn time_cublas(
    lhs: &CubeTensor<CudaRuntime>,
    rhs: &CubeTensor<CudaRuntime>,
    flops: f64,
    reps: usize,
    tf32: bool,
) -> Result<f64, String> {
    let launch = || {
        burn_offload::cuda_backend::cublas_matmul(lhs, rhs, tf32)
            .map(drop)
            .ok_or_else(|| "cuBLAS declined the case (layout, dtype or a failed call)".to_string())
    };
    launch()?;
    block_on(lhs.client.sync()).map_err(|e| format!("{e:?}"))?;
    let start = Instant::now();
    for _ in 0..reps {
        launch()?;
    }
    block_on(lhs.client.sync()).map_err(|e| format!("{e:?}"))?;
    Ok(flops * reps as f64 / start.elapsed().as_secs_f64() / 1e12)
}

fn main() {
    let cli = Cli::parse();
    let t = cli.tokens;
    let (d, ff, vocab) = (2048, 5632, 32000);
    let cases = [
        Case {
            name: "mlp_up",
            m: t,
            k: d,
            n: ff,
            lhs_transposed: false,
            rhs_transposed: false,
        },
        Case {
            name: "mlp_up_wgrad",
            m: d,
            k: t,
            n: ff,
            lhs_transposed: true,
            rhs_transposed: false,
        },
        Case {
            name: "mlp_up_igrad",
            m: t,
            k: ff,
            n: d,
            lhs_transposed: false,
            rhs_transposed: true,
        },
        Case {
            name: "head_chunk",
            m: 4096,
            k: d,
            n: vocab,
            lhs_transposed: false,
            rhs_transposed: false,
        },
        Case {
            name: "attn_proj",
            m: t,
            k: d,
            n: d,
            lhs_transposed: false,
            rhs_transposed: false,
        },
        Case {
            name: "mlp_down",
            m: t,
            k: ff,
            n: d,
            lhs_transposed: false,
            rhs_transposed: false,
        },
    ];
    // Let a failing strategy's panic message stay out of the JSON lines.
    std::panic::set_hook(Box::new(|_| {}));
    let start = Instant::now();
    let device = CudaDevice { index: 0 };
    for dtype_name in &cli.dtypes {
        let dtype = match dtype_name.as_str() {
            "bf16" => DType::BF16,
            "f32" => DType::F32,
            other => {
                eprintln!("error: unknown dtype `{other}` (bf16, f32)");
                std::process::exit(2);
            }
        };
        for case in &cases {
            let lhs = operand(case.m, case.k, case.lhs_transposed, dtype);
            let rhs = operand(case.k, case.n, case.rhs_transposed, dtype);
            let out = Tensor::<CudaBackend, 2>::zeros([case.m, case.n], &device)
                .cast(dtype)
                .into_primitive()
                .tensor();
            let flops = 2.0 * (case.m * case.k * case.n) as f64;
            let chosen = strategies().into_iter().filter(|s| {
                let name = s.to_string();
                cli.strategies.is_empty()
                    || cli
                        .strategies
                        .iter()
                        .any(|c| *c == name || (c == "auto" && matches!(s, Strategy::Auto)))
            });
            for strategy in chosen {
                if start.elapsed().as_secs_f64() > cli.budget_s {
                    eprintln!("budget of {} s spent; stopping", cli.budget_s);
                    return;
                }
                let result = time(&strategy, &lhs, &rhs, &out, flops, cli.reps);
                let line = match result {
                    Ok(tflops) => serde_json::json!({"case": case.name, "m": case.m, "k": case.k,
                        "n": case.n, "dtype": dtype_name, "strategy": strategy.to_string(),
                        "tflops": tflops}),
                    Err(e) => serde_json::json!({"case": case.name, "dtype": dtype_name,
                        "strategy": strategy.to_string(), "error": e.chars().take(160).collect::<String>()}),
                };
                println!("{line}");
            }
            let tf32_too = dtype_name == "f32";
            let kernels = [
                (burn_offload::cuda_backend::CUBLAS, false),
                (burn_offload::cuda_backend::CUBLAS_TF32, true),
            ];
            for (name, tf32) in kernels {
                if !cli.cublas || (tf32 && !tf32_too) {
                    continue;
                }
                let line = match time_cublas(&lhs, &rhs, flops, cli.reps, tf32) {
                    Ok(tflops) => serde_json::json!({"case": case.name, "m": case.m, "k": case.k,
                        "n": case.n, "dtype": dtype_name, "strategy": name, "tflops": tflops}),
                    Err(e) => serde_json::json!({"case": case.name, "dtype": dtype_name,
                        "strategy": name, "error": e}),
                };
                println!("{line}");
            }
        }
    }
}
