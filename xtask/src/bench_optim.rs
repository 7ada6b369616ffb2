//! `cargo xtask bench optim`: one AdamW step over N parameters, several ways,
//! in one process: burn-offload's fused rayon loop over host slabs (also
//! writing the bf16 copy, with 8-bit moments, reading bf16 gradients), the
//! same math as a single-threaded scalar loop, and burn-optim's AdamW on
//! burn-flex tensors. Reports the median of `--repeats` timed steps after a warm-up.

use std::time::Instant;

use anyhow::{Context, Result};
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::optim::{AdamWConfig as BurnAdamW, GradientsParams, Optimizer};
use burn::tensor::{Distribution, Tensor};
use burn_offload::{AdamWConfig, OptimizerConfig};
use burn_offload::{GradSlice, MomentSlices, UpdateSlices};
use serde::Serialize;

#[derive(clap::Args)]
pub struct Args {
    /// Parameters per step.
    #[arg(long, default_value_t = 1 << 24)]
    params: usize,
    /// Timed steps per variant (median reported).
    #[arg(long, default_value_t = 7)]
    repeats: usize,
    /// Where to write the JSON and markdown results.
    #[arg(long, default_value = "bench/results")]
    out: std::path::PathBuf,
}

#[derive(Serialize)]
struct Row {
    variant: &'static str,
    median_ms: f64,
    gparam_per_s: f64,
}

#[derive(Module, Debug)]
struct Flat<B: burn::tensor::backend::Backend> {
    w: Param<Tensor<B, 1>>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `f` once for warm-up and `repeats` times; returns the median in seconds.
fn time(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..repeats)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// The same update as burn-offload's loop, one element at a time on one thread.
fn scalar_adamw(
    c: &AdamWConfig,
    step: i32,
    lr: f32,
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
) {
    let (b1, b2) = (c.beta_1, c.beta_2);
    let (bias_1, bias_2) = (1.0 - b1.powi(step), 1.0 - b2.powi(step));
    let decay = 1.0 - lr * c.weight_decay;
    for i in 0..p.len() {
        m[i] = m[i] * b1 + g[i] * (1.0 - b1);
        v[i] = v[i] * b2 + g[i] * g[i] * (1.0 - b2);
        p[i] = p[i] * decay - lr * (m[i] / bias_1) / ((v[i] / bias_2).sqrt() + c.epsilon);
    }
}

pub fn run(args: Args) -> Result<()> {
    let n = args.params;
    let config = AdamWConfig {
        weight_decay: 0.01,
        ..Default::default()
    };
    let grads: Vec<f32> = (0..n).map(|i| ((i % 1000) as f32 - 500.0) * 1e-4).collect();
    let (mut p, mut m, mut v) = (vec![0.01f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let threads = std::thread::available_parallelism()
        .map(|t| t.get())
        .unwrap_or(1);

    let mut step = 0u64;
    let ours = time(args.repeats, || {
        step += 1;
        let slices = UpdateSlices {
            params: &mut p,
            moments: MomentSlices::F32 {
                m: &mut m,
                v: &mut v,
            },
            grads: GradSlice::F32(&grads),
            bf16: None,
        };
        OptimizerConfig::AdamW(config).update(step, 1e-3, 1.0, slices);
    });

    // bf16 compute mode: the same update also writes the bf16 copy.
    let mut copy = vec![burn::tensor::bf16::ZERO; n];
    let ours_bf16 = time(args.repeats, || {
        step += 1;
        let slices = UpdateSlices {
            params: &mut p,
            moments: MomentSlices::F32 {
                m: &mut m,
                v: &mut v,
            },
            grads: GradSlice::F32(&grads),
            bf16: Some(&mut copy),
        };
        OptimizerConfig::AdamW(config).update(step, 1e-3, 1.0, slices);
    });

    // 8-bit moments (--optim-state 8bit): dequantise, update, quantise.
    let blocks = n.div_ceil(burn_offload::QUANT_BLOCK);
    let (mut m8, mut v8) = (vec![0u8; n], vec![0u8; n]);
    let (mut m8_absmax, mut v8_absmax) = (vec![0.0f32; blocks], vec![0.0f32; blocks]);
    let ours_8bit = time(args.repeats, || {
        step += 1;
        let slices = UpdateSlices {
            params: &mut p,
            moments: MomentSlices::Q8 {
                m: &mut m8,
                m_absmax: &mut m8_absmax,
                v: &mut v8,
                v_absmax: &mut v8_absmax,
            },
            grads: GradSlice::F32(&grads),
            bf16: None,
        };
        OptimizerConfig::AdamW(config).update(step, 1e-3, 1.0, slices);
    });

    // bf16 gradients (--host-layout compact): widened as they are read.
    let grads_bf16: Vec<_> = grads
        .iter()
        .map(|&g| burn::tensor::bf16::from_f32(g))
        .collect();
    let ours_bf16_grads = time(args.repeats, || {
        step += 1;
        let slices = UpdateSlices {
            params: &mut p,
            moments: MomentSlices::F32 {
                m: &mut m,
                v: &mut v,
            },
            grads: GradSlice::Bf16(&grads_bf16),
            bf16: None,
        };
        OptimizerConfig::AdamW(config).update(step, 1e-3, 1.0, slices);
    });

    let mut step = 0i32;
    let scalar = time(args.repeats, || {
        step += 1;
        scalar_adamw(&config, step, 1e-3, &mut p, &mut m, &mut v, &grads);
    });

    type AB = Autodiff<Flex>;
    let device = Default::default();
    let mut module = Flat::<AB> {
        w: Param::from_tensor(Tensor::random(
            [n],
            Distribution::Normal(0.0, 0.02),
            &device,
        )),
    };
    let grad =
        Tensor::<Flex, 1>::from_data(burn::tensor::TensorData::new(grads.clone(), [n]), &device);
    let mut optim = BurnAdamW::new()
        .with_weight_decay(0.01)
        .init::<AB, Flat<AB>>();
    let burn_optim = time(args.repeats, || {
        let mut g = GradientsParams::new();
        g.register(module.w.id, grad.clone());
        module = optim.step(1e-3, module.clone(), g);
        // Force the lazy result so the step is really computed.
        let _ = module.w.val().inner().narrow(0, 0, 1).into_data();
    });

    let rows = [
        ("burn-offload fused rayon loop", ours),
        ("scalar loop (1 thread)", scalar),
        ("burn-optim AdamW on burn-flex", burn_optim),
        ("burn-offload loop writing the bf16 copy", ours_bf16),
        ("burn-offload loop, 8-bit moments", ours_8bit),
        ("burn-offload loop, bf16 gradients", ours_bf16_grads),
    ]
    .map(|(variant, secs)| Row {
        variant,
        median_ms: secs * 1e3,
        gparam_per_s: n as f64 / secs / 1e9,
    });

    let command = format!(
        "cargo xtask bench optim --params {n} --repeats {}",
        args.repeats
    );
    let mut md = format!(
        "# CPU AdamW throughput\n\n`{command}` on {threads} CPU threads, {n} parameters, median of {} steps after one warm-up step.\n\n| variant | median ms/step | Gparam/s |\n|---|---:|---:|\n",
        args.repeats
    );
    for r in &rows {
        md += &format!(
            "| {} | {:.1} | {:.3} |\n",
            r.variant, r.median_ms, r.gparam_per_s
        );
    }
    md += &format!(
        "\nours ÷ burn-optim: {:.1}×; ours ÷ scalar: {:.1}×; with the bf16 copy ÷ without: {:.2}×; 8-bit moments ÷ fp32: {:.2}×; bf16 gradients ÷ fp32: {:.2}×\n",
        rows[0].gparam_per_s / rows[2].gparam_per_s,
        rows[0].gparam_per_s / rows[1].gparam_per_s,
        rows[3].gparam_per_s / rows[0].gparam_per_s,
        rows[4].gparam_per_s / rows[0].gparam_per_s,
        rows[5].gparam_per_s / rows[0].gparam_per_s
    );
    print!("{md}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let json =
        serde_json::json!({ "command": command, "threads": threads, "params": n, "rows": rows });
    std::fs::write(
        args.out.join("optim-cpu.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::write(args.out.join("optim-cpu.md"), md)?;
    Ok(())
}
