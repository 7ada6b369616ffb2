//! The training loop a burn user writes by hand (forward, loss, backward,
//! optimizer step), run on burn-offload.
//!
//! [`train`] is plain burn, generic over the autodiff backend and the
//! optimizer; nothing in it knows about offloading. `main` switches it to
//! offload by its type parameter: the model is built on
//! `Autodiff<Offload<B>>`, so its parameters live in host memory and each
//! operation pages in the weights it reads, and the optimizer is
//! burn-offload's host AdamW, which keeps its moments in host memory and
//! parks the updated parameters there again. The model's forward
//! (`BlockModel::forward`) runs each block as a checkpoint on this backend:
//! the backward rebuilds one block's graph at a time and sends its
//! gradients to host memory, so the device holds one block's activations.
//! `--plain` runs the same loop on `Autodiff<B>` with burn's own AdamW, for
//! comparison.
//!
//! The model is the workspace's tiny Llama (vocabulary 256), trained on the
//! bytes of a short text: each byte is a token.
//!
//! Run: `cargo run -p custom-loop -- --steps 30` (`--features cuda` for
//! CUDA).

use burn::backend::Autodiff;
use burn::optim::{GradientsParams, Optimizer};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_offload::{BlockModel, BlockRecompute, HostOptimizerConfig, Offload};
use clap::Parser;
use models::{cross_entropy, Llama, LlamaConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The backend that computes: burn-flex on the CPU, or burn's CUDA backend
/// with cuBLAS matmuls (`--features cuda`).
#[cfg(not(feature = "cuda"))]
type Inner = burn::backend::Flex;
#[cfg(feature = "cuda")]
type Inner = burn_offload::Gemm<burn::backend::Cuda>;

/// The corpus: the opening of Dickens's *A Tale of Two Cities* (public
/// domain), one token per byte.
const TEXT: &str = "It was the best of times, it was the worst of times, it was the age of \
wisdom, it was the age of foolishness, it was the epoch of belief, it was the epoch of \
incredulity, it was the season of Light, it was the season of Darkness, it was the spring of \
hope, it was the winter of despair, we had everything before us, we had nothing before us, we \
were all going direct to Heaven, we were all going direct the other way - in short, the period \
was so far like the present period, that some of its noisiest authorities insisted on its being \
received, for good or for evil, in the superlative degree of comparison only.";

/// Tokens a row is trained on; its targets are the same bytes shifted by one.
const SEQ: usize = 64;
/// Seeds the weights and the batches.
const SEED: u64 = 42;

#[derive(Parser, Debug)]
#[command(about = "A hand-written burn training loop on burn-offload")]
struct Args {
    /// Optimizer steps.
    #[arg(long, default_value_t = 30)]
    steps: usize,
    /// AdamW's learning rate (constant).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Rows per batch.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Train on plain `Autodiff<B>` with burn's AdamW instead of offload.
    #[arg(long)]
    plain: bool,
}

/// A batch of `rows` windows of the text at random offsets: the inputs, and
/// the targets (each input's next byte).
fn batch<B: Backend>(
    rng: &mut StdRng,
    rows: usize,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let bytes = TEXT.as_bytes();
    let tokens: Vec<i64> = (0..rows)
        .flat_map(|_| {
            let start = rng.random_range(0..bytes.len() - SEQ);
            bytes[start..=start + SEQ].iter().map(|&b| i64::from(b))
        })
        .collect();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [rows, SEQ + 1]), device);
    let inputs = tokens.clone().narrow(1, 0, SEQ);
    let targets = tokens.narrow(1, 1, SEQ);
    (inputs, targets)
}

/// The loop: plain burn, for any autodiff backend and optimizer. Prints the
/// loss of each step and returns the trained model.
fn train<B, O>(mut model: Llama<B>, mut optim: O, args: &Args, device: &B::Device) -> Llama<B>
where
    B: AutodiffBackend + BlockRecompute,
    O: Optimizer<Llama<B>, B>,
{
    let mut rng = StdRng::seed_from_u64(SEED);
    for step in 1..=args.steps {
        // Data: next-byte prediction over random windows of the text.
        let (inputs, targets) = batch::<B>(&mut rng, args.batch, device);

        // Forward: logits `[batch, SEQ, vocab]`, the mean cross-entropy.
        let logits = model.forward(inputs);
        let loss = cross_entropy(logits, targets);
        let value: f32 = loss.clone().into_scalar().elem();
        println!("step {step:>4}  loss {value:.4}");

        // Backward: the gradients of the graph, keyed by parameter.
        let grads = GradientsParams::from_grads(loss.backward(), &model);

        // Update: the optimizer takes the model and gives back the new one.
        model = optim.step(args.lr, model, grads);
    }
    model
}

fn main() {
    let args = Args::parse();
    let config = LlamaConfig::tiny();
    println!(
        "tiny Llama, {} parameters; {} text bytes; uniform loss ln 256 = {:.4}",
        config.num_params(),
        TEXT.len(),
        (config.vocab_size as f64).ln()
    );

    if args.plain {
        // burn as it comes: parameters and AdamW's moments on the device.
        type B = Autodiff<Inner>;
        let device = Default::default();
        B::seed(&device, SEED);
        let model = config.init::<B>(&device);
        let optim = burn::optim::AdamWConfig::new().init::<B, Llama<B>>();
        train(model, optim, &args, &device);
    } else {
        // The same loop on offload: only the type parameter and the
        // optimizer change.
        type B = Autodiff<Offload<Inner>>;
        let device = Default::default();
        B::seed(&device, SEED);
        let model = config.init::<B>(&device);
        let optim =
            HostOptimizerConfig::adamw(burn_offload::AdamWConfig::default()).init::<B, Llama<B>>();
        train(model, optim, &args, &device);
        let paged = burn_offload::residency::stats();
        println!(
            "paged in {:.1} MB of parameters over {} steps; {} blocks recomputed in the \
             backward; device peak {:.1} MB",
            paged.bytes_to_device as f64 / 1e6,
            args.steps,
            burn_offload::recomputed_blocks(),
            paged.peak_device_bytes as f64 / 1e6
        );
    }
}
