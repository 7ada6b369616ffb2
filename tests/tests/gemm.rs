//! `Gemm<B>`: with `auto` it computes exactly what `B` computes (the engine
//! and plain burn, bit for bit); a kernel name it does not know is an error;
//! on CUDA, a chosen cubek strategy matches burn's own matmul within the
//! tolerance of a different summation order.

use std::sync::Mutex;

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::prelude::*;
use burn_offload::{
    matmul_names, set_matmul, AdamWConfig, Compute, Engine, EngineConfig, Gemm, HostStore,
    MatmulError, OptimizerConfig,
};
#[cfg(feature = "cuda")]
use burn_offload_tests::rel_err;
use burn_offload_tests::{batch, Batch, TestBackend as B};
use models::LlamaConfig;
use trainer::options::TrainOptions;
use trainer::run::run;

type G = Gemm<B>;

/// The matmul kernel is chosen process-wide: tests that set or rely on it run
/// one at a time.
static KERNEL: Mutex<()> = Mutex::new(());

fn engine_config() -> EngineConfig {
    EngineConfig {
        optimizer: OptimizerConfig::AdamW(AdamWConfig::default()),
        grad_clip: Some(1.0),
        fused: false,
        loss_chunk_tokens: 8,
        skip_non_finite: true,
        overlap: true,
        device_checkpoints: 0,
        compute: Compute::Fp32,
        cast_on_device: false,
        compute_precision_gradients: false,
        eight_bit_moments: false,
        kept_graphs: 0,
        kept_attention: 0,
        blocking_sync: true,
        hold_updates_for_copies: true,
        gradient_blocks_in_flight: 4,
    }
}

/// The same batch as tensors of `Gemm<B>` (whose int tensors are `B`'s).
fn as_gemm((x, y): &Batch) -> (Tensor<G, 2, Int>, Tensor<G, 2, Int>) {
    (
        Tensor::from_primitive(x.clone().into_primitive()),
        Tensor::from_primitive(y.clone().into_primitive()),
    )
}

/// Engine steps on `B` and on `Gemm<B>` from the same seed, on one batch
/// (so that the loss must fall): losses, gradient norms and final
/// parameters, as `(losses, norms, params)`.
#[allow(clippy::type_complexity)]
fn train_both(
    steps: u64,
) -> (
    (Vec<f32>, Vec<f32>),
    (Vec<f32>, Vec<f32>),
    (Vec<f32>, Vec<f32>),
) {
    let device = Default::default();
    let config = LlamaConfig::tiny();
    // Parameters are drawn lazily, when the engine first reads them: seed
    // right before each engine is built.
    B::seed(&device, 7);
    let plain = config.init::<Autodiff<B>>(&device).valid();
    let mut plain = Engine::new(plain, engine_config(), &device).unwrap();
    G::seed(&device, 7);
    let gemm = config.init::<Autodiff<G>>(&device).valid();
    let mut gemm = Engine::new(gemm, engine_config(), &device).unwrap();
    assert!(
        flat(plain.store()) == flat(gemm.store()),
        "the same seed gives the same initial weights"
    );
    let (mut losses, mut norms) = ((vec![], vec![]), (vec![], vec![]));
    let data = batch(2, 8, config.vocab_size, 10);
    for _ in 0..steps {
        let a = plain.step(std::slice::from_ref(&data), 1e-2).unwrap();
        let b = gemm.step(&[as_gemm(&data)], 1e-2).unwrap();
        losses.0.push(a.loss);
        losses.1.push(b.loss);
        norms.0.push(a.grad_norm as f32);
        norms.1.push(b.grad_norm as f32);
    }
    let (a, b) = (plain.into_store(), gemm.into_store());
    (losses, norms, (flat(&a), flat(&b)))
}

fn flat(store: &HostStore) -> Vec<f32> {
    store
        .groups
        .iter()
        .flat_map(|g| g.params.as_slice().to_vec())
        .collect()
}

#[test]
fn gemm_with_burns_matmul_trains_bit_for_bit_like_its_backend() {
    let _one = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    set_matmul("auto").unwrap();
    let (losses, norms, params) = train_both(3);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&losses.0), bits(&losses.1), "losses");
    assert_eq!(bits(&norms.0), bits(&norms.1), "gradient norms");
    assert!(params.0 == params.1, "parameters after 3 steps");
    assert!(losses.0[2] < losses.0[0], "the steps train: {:?}", losses.0);
}

#[test]
fn an_unknown_matmul_kernel_is_a_clear_error() {
    let _one = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let err = set_matmul("matmul_fastest_please").unwrap_err();
    assert!(
        matches!(&err, MatmulError::Unknown { name, .. } | MatmulError::NeedsCuda(name)
            if name == "matmul_fastest_please"),
        "{err}"
    );
    assert!(matmul_names().contains(&"auto".to_string()));
    // The selection is unchanged by a refused name, and `auto` is always there.
    set_matmul("auto").unwrap();
    let err = run(&TrainOptions {
        matmul: "matmul_fastest_please".into(),
        steps: 1,
        ..Default::default()
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("--matmul"), "{err:#}");
}

/// On the GPU, each chosen kernel computes the engine's steps like burn's own
/// matmul, within the tolerance of another summation order and of TF32:
/// burn's f32 matmul may stage its inputs as TF32 (cubek's tensor-core
/// kernels do), cuBLAS here computes in full f32, and the two differ by ~1e-3
/// on the tiny model's first loss (bench/results/cuda-bench). Parameters after AdamW
/// steps are not compared: AdamW scales each update to about `lr` whatever
/// the gradient's size, so where a gradient is near zero another rounding
/// flips the update's sign; the first step's loss (same weights, forward
/// only) and gradient norm are compared, then the loss curve.
#[cfg(feature = "cuda")]
#[test]
fn chosen_cuda_matmul_kernels_match_burns() {
    let _one = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    set_matmul("auto").unwrap();
    let (reference, reference_norms, _) = train_both(2);
    for name in [
        "fast",
        "cublas",
        "cublas-tf32",
        "matmul_simple_tma_mma",
        "matmul_specialized_tma_mma",
        "matmul_simple_cyclic_mma_multi_rows",
    ] {
        set_matmul(name).unwrap();
        let (losses, norms, _) = train_both(2);
        set_matmul("auto").unwrap();
        let first_loss = rel_err(&losses.1[..1], &reference.0[..1]);
        let first_norm = rel_err(&norms.1[..1], &reference_norms.0[..1]);
        let curve = rel_err(&losses.1, &reference.0);
        println!(
            "{name}: first loss rel. err {first_loss:.2e}, first gradient norm {first_norm:.2e}, \
             losses {curve:.2e}"
        );
        assert!(
            first_loss < 5e-3,
            "{name}: first loss {} vs {}",
            losses.1[0],
            reference.0[0]
        );
        assert!(
            first_norm < 5e-2,
            "{name}: first gradient norm {first_norm}"
        );
        assert!(
            curve < 5e-2,
            "{name}: losses {:?} vs {:?}",
            losses.1,
            reference.0
        );
    }
}

/// bf16 attention on the GPU through each chosen kernel, against burn's own
/// matmul. Its `[weights] · [v | 1 | 0…]` product has 80 columns, a width
/// cubecl may pitch (pad its rows); cuBLAS assuming a contiguous output made
/// the 0.85B Llama's bf16 loss NaN from the first step.
/// Whether this small shape gets a padded output was not checked on the
/// unfixed build; the 0.85B bf16 rows in bench/results/cuda-bench are the
/// measured check.
/// The reference formulation has that product; the graph-free forward of
/// `causal_attention` (what `G` runs) is checked beside it.
#[cfg(feature = "cuda")]
#[test]
fn chosen_cuda_matmul_kernels_compute_bf16_attention_like_burns() {
    use burn::tensor::{DType, Distribution};
    use burn_offload::ops::attention::{causal_attention, reference_causal_attention};

    let _one = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let device = Default::default();
    let shape = [2, 4, 96, 64];
    G::seed(&device, 11);
    let random = || Tensor::<G, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let (q, k, v) = (random(), random(), random());
    let bf16 = |t: &Tensor<G, 4>| t.clone().cast(DType::BF16);
    type Attention = fn(Tensor<G, 4>, Tensor<G, 4>, Tensor<G, 4>) -> Tensor<G, 4>;
    let ways: [(&str, Attention); 2] = [
        ("reference", reference_causal_attention),
        ("forward", causal_attention),
    ];
    for (way, attention) in ways {
        let attend = || attention(bf16(&q), bf16(&k), bf16(&v)).cast(DType::F32);
        set_matmul("auto").unwrap();
        let reference = attend();
        for name in ["fast", "cublas", "matmul_simple_tma_mma"] {
            set_matmul(name).unwrap();
            let out = attend();
            set_matmul("auto").unwrap();
            let err = burn_offload_tests::max_rel_err(out, reference.clone(), 1.0);
            println!("{way} {name}: bf16 attention max error {err:.2e}");
            assert!(err < 5e-2, "{way} {name}: bf16 attention differs by {err}");
            // false for NaN
        }
    }
}
