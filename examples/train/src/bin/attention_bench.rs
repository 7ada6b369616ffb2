//! GPU time of causal attention's passes on the 0.85B Llama's shapes (32
//! query heads over 8 key/value heads, 1024 positions, head width 64):
//! burn-offload's attention (one autodiff operation, backward in closed form)
//! against the reference formulation autodiff differentiates op by op, and
//! the single tensor ops both are made of, so a slow op shows by name.
//!
//! Output: one JSON object per line (case, sequences, median milliseconds).

use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Distribution, Tensor};
use burn_offload::ops::attention::{
    causal_attention, causal_attention_fused, causal_attention_tiled, cudnn_attention_runs,
    reference_causal_attention, Tiling,
};
use clap::Parser;

type G = burn_offload::Gemm<burn::backend::Cuda>;
type AD = Autodiff<G>;

#[derive(Parser)]
#[command(about = "Times causal attention's passes on the GPU")]
struct Cli {
    /// Sequences per batch (each of 1024 positions).
    #[arg(long, value_delimiter = ',', default_value = "4,16")]
    batch: Vec<usize>,
    /// Timed repetitions per case (after two untimed ones).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Instead of the cases: this many forward+backward passes of each
    /// attention, one line per pass (does the time drift?).
    #[arg(long, default_value_t = 0)]
    drift: usize,
    /// Instead of the cases: one sequence of each of these lengths, in
    /// `--dtype`, burn-offload's attention forward and forward+backward,
    /// with their TFLOPS as FlashAttention counts them (the forward's two
    /// products over the causal half, `2·h·s²·d`; the backward 2.5 times
    /// that), to set beside `bench/peers/torch_sdpa.py`.
    #[arg(long, value_delimiter = ',')]
    lengths: Vec<usize>,
    /// The long cases' dtype: bf16 or f32.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// The long cases' head width (64: the 0.85B and Llama-3.2-1B; 128: the
    /// 3B and 8B shapes).
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    /// The long cases to run: `fused` (the CubeCL kernels), `models` (as
    /// the models run it: cuDNN where libcudnn is found), `tiles`.
    #[arg(long, value_delimiter = ',', default_value = "fused,models,tiles")]
    cases: Vec<String>,
    /// The long cases' query heads and key/value heads.
    #[arg(long, value_delimiter = ',', default_value = "32,8")]
    heads: Vec<usize>,
}

/// `--lengths`: one sequence of each length through burn-offload's
/// attention, the forward alone and with its backward: both passes in the
/// fused kernels ("fused"), as the models run it ("models": past
/// `FUSED_BACKWARD_UP_TO` the fused forward and the tiled backward), and
/// through query blocks and key tiles in tensor ops ("tiles").
fn long_cases(cli: &Cli, device: &burn::tensor::Device<G>) {
    let dtype = match cli.dtype.as_str() {
        "bf16" => burn::tensor::DType::BF16,
        "f32" => burn::tensor::DType::F32,
        other => panic!("--dtype {other}: bf16 or f32"),
    };
    let [heads, kv] = cli.heads[..] else {
        panic!("--heads: query heads and key/value heads, e.g. 32,8")
    };
    let d = cli.head_dim;
    for &seq in &cli.lengths {
        let randn = |shape: [usize; 4]| {
            Tensor::<G, 4>::random(shape, Distribution::Normal(0.0, 1.0), device).cast(dtype)
        };
        let heads_view = |n| randn([1, seq, n, d]).swap_dims(1, 2);
        let (q, k, v) = (heads_view(heads), heads_view(kv), heads_view(kv));
        let weights = randn([1, heads, seq, d]);
        let forward_flops = 2.0 * heads as f64 * (seq as f64).powi(2) * d as f64;
        // `path`: whether cuDNN ran the case's passes (the models' choice
        // where libcudnn is found) or the crate's own kernels and tiles.
        let report = |case: &str, ms: f64, flops: f64, cudnn: bool| {
            println!(
                "{{\"case\": \"{case}\", \"seq\": {seq}, \"heads\": {heads}, \"kv_heads\": {kv}, \"head_dim\": {d}, \"dtype\": \"{}\", \"path\": \"{}\", \"ms\": {ms:.3}, \"tflops\": {:.1}}}",
                cli.dtype,
                if cudnn { "cudnn" } else { "cubecl" },
                flops / (ms * 1e-3) * 1e-12
            );
        };
        type Attention<X> = Box<dyn Fn(Tensor<X, 4>, Tensor<X, 4>, Tensor<X, 4>) -> Tensor<X, 4>>;
        let tiling = Tiling::new(heads, seq);
        let ways: [(&str, Attention<G>, Attention<AD>); 3] = [
            (
                "fused",
                Box::new(causal_attention_fused),
                Box::new(causal_attention_fused),
            ),
            (
                "models",
                Box::new(causal_attention),
                Box::new(causal_attention),
            ),
            (
                "tiles",
                Box::new(move |q, k, v| causal_attention_tiled(q, k, v, tiling)),
                Box::new(move |q, k, v| causal_attention_tiled(q, k, v, tiling)),
            ),
        ];
        for (name, plain, tracked) in &ways {
            if !cli.cases.iter().any(|c| c == name) {
                continue;
            }
            let runs = cudnn_attention_runs();
            let ms = time(cli.reps, device, || {
                let _ = plain(q.clone(), k.clone(), v.clone());
            });
            report(
                &format!("{name} forward"),
                ms,
                forward_flops,
                cudnn_attention_runs() > runs,
            );
            let runs = cudnn_attention_runs();
            let ad = |t: &Tensor<G, 4>| Tensor::<AD, 4>::from_inner(t.clone()).require_grad();
            let ms = time(cli.reps, device, || {
                let (qa, ka, va) = (ad(&q), ad(&k), ad(&v));
                let out = tracked(qa.clone(), ka.clone(), va.clone());
                let grads = (out * Tensor::from_inner(weights.clone())).sum().backward();
                let _ = (qa.grad(&grads), ka.grad(&grads), va.grad(&grads));
            });
            report(
                &format!("{name} forward+backward"),
                ms,
                3.5 * forward_flops,
                cudnn_attention_runs() > runs,
            );
        }
    }
}

/// Median milliseconds of `f`, the device synchronised around each run.
fn time(reps: usize, device: &burn::tensor::Device<G>, mut f: impl FnMut()) -> f64 {
    let mut ms = Vec::new();
    // `reps == 0` (the drift mode): one run, timed, with no warm-up, so the
    // first pass (which compiles the kernels) shows too.
    let warm = if reps == 0 { 0 } else { 2 };
    for rep in 0..reps.max(1) + warm {
        G::sync(device).expect("sync");
        let start = Instant::now();
        f();
        G::sync(device).expect("sync");
        if rep >= warm {
            ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    ms.sort_by(f64::total_cmp);
    ms[ms.len() / 2]
}

fn main() {
    let cli = Cli::parse();
    burn_offload::set_matmul(burn_offload::DEFAULT_MATMUL).expect("default matmul");
    let device = Default::default();
    if !cli.lengths.is_empty() {
        return long_cases(&cli, &device);
    }
    let (heads, kv, seq, d) = (32, 8, 1024, 64);
    for &b in &cli.batch {
        let randn = |shape: [usize; 4]| {
            Tensor::<G, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device)
        };
        // Laid out as the model hands them over: `[b, s, heads, d]` viewed
        // as `[b, heads, s, d]`.
        let heads_view = |n| randn([b, seq, n, d]).swap_dims(1, 2);
        let (q, k, v) = (heads_view(heads), heads_view(kv), heads_view(kv));
        let weights = randn([b, heads, seq, d]);
        let report = |case: &str, ms: f64| {
            println!("{{\"case\": \"{case}\", \"sequences\": {b}, \"ms\": {ms:.3}}}");
        };
        type Attention = fn(Tensor<AD, 4>, Tensor<AD, 4>, Tensor<AD, 4>) -> Tensor<AD, 4>;
        let ways: [(&str, Attention); 2] = [
            ("reference", reference_causal_attention),
            ("offload", causal_attention),
        ];
        for (name, attention) in ways {
            let ad = |t: &Tensor<G, 4>| Tensor::<AD, 4>::from_inner(t.clone()).require_grad();
            let pass = || {
                let (qa, ka, va) = (ad(&q), ad(&k), ad(&v));
                let out = attention(qa.clone(), ka.clone(), va.clone());
                let grads = (out * Tensor::from_inner(weights.clone())).sum().backward();
                let _ = (qa.grad(&grads), ka.grad(&grads), va.grad(&grads));
            };
            if cli.drift > 0 {
                for i in 0..cli.drift {
                    report(
                        &format!("{name} forward+backward pass {i}"),
                        time(0, &device, pass),
                    );
                }
                continue;
            }
            report(
                &format!("{name} forward+backward"),
                time(cli.reps, &device, pass),
            );
        }
        if cli.drift > 0 {
            continue;
        }
        let ms = time(cli.reps, &device, || {
            let _ = causal_attention(q.clone(), k.clone(), v.clone());
        });
        report("offload forward (no graph)", ms);
        let ms = time(cli.reps, &device, || {
            let _ = reference_causal_attention(q.clone(), k.clone(), v.clone());
        });
        report("reference forward (no graph)", ms);

        // The ops, on the grouped layout `[b, kv, 4·s, d]` and the repeated
        // one `[b, h, s, d]`.
        let qg = q.clone().reshape([b, kv, heads / kv * seq, d]);
        let rows = heads / kv * seq;
        let kt = k.clone().swap_dims(2, 3);
        let ms = time(cli.reps, &device, || {
            let _ = qg.clone().matmul(kt.clone());
        });
        report("matmul q·kᵀ grouped", ms);
        let kr = randn([b, heads, seq, d]);
        let ms = time(cli.reps, &device, || {
            let _ = q.clone().matmul(kr.clone().swap_dims(2, 3));
        });
        report("matmul q·kᵀ per head", ms);
        let scores = qg.clone().matmul(kt.clone());
        let ms = time(cli.reps, &device, || {
            let future = Tensor::<G, 2, Bool>::tril_mask([seq, seq], 0, &device)
                .unsqueeze::<5>()
                .expand([b, kv, heads / kv, seq, seq]);
            let _ = scores
                .clone()
                .reshape([b, kv, heads / kv, seq, seq])
                .mask_fill(future, f32::NEG_INFINITY)
                .reshape([b, kv, rows, seq]);
        });
        report("mask_fill 5-d", ms);
        let scores4 = q.clone().matmul(kr.clone().swap_dims(2, 3));
        let ms = time(cli.reps, &device, || {
            let future = Tensor::<G, 2, Bool>::tril_mask([seq, seq], 0, &device)
                .unsqueeze::<4>()
                .expand([b, heads, seq, seq]);
            let _ = scores4.clone().mask_fill(future, f32::NEG_INFINITY);
        });
        report("mask_fill 4-d", ms);
        let ms = time(cli.reps, &device, || {
            let _ = Tensor::<G, 2, Bool>::tril_mask([seq, seq], 0, &device);
        });
        report("tril_mask", ms);
        let ms = time(cli.reps, &device, || {
            let _ = scores.clone().max_dim(3);
        });
        report("max_dim", ms);
        let ms = time(cli.reps, &device, || {
            let _ = scores.clone().sum_dim(3);
        });
        report("sum_dim", ms);
        let row = scores.clone().max_dim(3);
        let ms = time(cli.reps, &device, || {
            let _ = (scores.clone() - row.clone()).exp();
        });
        report("exp(scores - row)", ms);
        let grad = randn([b, kv, rows, d]);
        let ms = time(cli.reps, &device, || {
            let _ = scores.clone().swap_dims(2, 3).matmul(grad.clone());
        });
        report("matmul Pᵀ·dO", ms);
        let ms = time(cli.reps, &device, || {
            let _ = scores.clone().matmul(v.clone());
        });
        report("matmul P·v (v a swap_dims view)", ms);
        let vc = randn([b, kv, seq, d]);
        let ms = time(cli.reps, &device, || {
            let _ = scores.clone().matmul(vc.clone());
        });
        report("matmul P·v (v contiguous)", ms);
        let ms = time(cli.reps, &device, || {
            let _ = grad.clone().matmul(v.clone().swap_dims(2, 3));
        });
        report("matmul dO·vᵀ", ms);
        let ms = time(cli.reps, &device, || {
            let _ = scores.clone() * (scores.clone() - row.clone());
        });
        report("P ⊙ (dP - row)", ms);
        let ms = time(cli.reps, &device, || {
            let _ = scores.clone().swap_dims(2, 3).matmul(qg.clone());
        });
        report("matmul dSᵀ·q", ms);
        let quarter = b.div_ceil(4);
        let ms = time(cli.reps, &device, || {
            for start in (0..b).step_by(quarter) {
                let len = quarter.min(b - start);
                let _ = qg
                    .clone()
                    .narrow(0, start, len)
                    .matmul(k.clone().narrow(0, start, len).swap_dims(2, 3));
            }
        });
        report("matmul q·kᵀ grouped, in 4 narrowed chunks", ms);
    }
}
