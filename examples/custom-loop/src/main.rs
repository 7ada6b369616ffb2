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
//! The model is the workspace's tiny Llama (vocabulary 256) or, with
//! `--shape llama7b`, Llama-2-7B's shape, trained on the bytes of a short
//! text: each byte is a token.
//!
//! Run: `cargo run -p custom-loop -- --steps 30` (`--features cuda` for
//! CUDA). A model larger than the GPU, through the same loop:
//! `cargo run --release --features cuda -p custom-loop -- --shape llama7b
//! --batch 16 --seq 1024 --steps 6 --lr 1e-5` (108 GB of host memory for
//! the weights and the host AdamW's moments, 27 GB more for the gradients).

use burn::backend::Autodiff;
use burn::optim::{GradientsParams, Optimizer};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_offload::{BlockModel, BlockRecompute, HostOptimizerConfig, Offload};
use clap::Parser;
use models::{cross_entropy, Llama, LlamaConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

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
    /// Tokens a row; its targets are the same bytes shifted by one (the text
    /// repeats where a row is longer).
    #[arg(long, default_value_t = 64)]
    seq: usize,
    /// The model's shape (random weights): the tiny Llama, or Llama-2-7B's
    /// (whose weights and Adam moments, 108 GB in fp32, fit no GPU).
    #[arg(long, value_enum, default_value = "tiny")]
    shape: Shape,
    /// Blocks, where not the shape's (the same width at another depth).
    #[arg(long)]
    layers: Option<usize>,
    /// Train on plain `Autodiff<B>` with burn's AdamW instead of offload.
    #[arg(long)]
    plain: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Shape {
    Tiny,
    Llama7b,
}

impl Args {
    fn config(&self) -> LlamaConfig {
        let shape = match self.shape {
            Shape::Tiny => LlamaConfig::tiny(),
            Shape::Llama7b => LlamaConfig::llama_7b(),
        };
        LlamaConfig {
            n_layer: self.layers.unwrap_or(shape.n_layer),
            max_seq_len: shape.max_seq_len.max(self.seq),
            ..shape
        }
    }
}

/// A batch of `rows` windows of the text at random offsets: the inputs, and
/// the targets (each input's next byte).
fn batch<B: Backend>(
    rng: &mut StdRng,
    rows: usize,
    seq: usize,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let bytes = TEXT.as_bytes();
    let tokens: Vec<i64> = (0..rows)
        .flat_map(|_| {
            let start = rng.random_range(0..bytes.len());
            bytes
                .iter()
                .cycle()
                .skip(start)
                .take(seq + 1)
                .map(|&b| i64::from(b))
        })
        .collect();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [rows, seq + 1]), device);
    let inputs = tokens.clone().narrow(1, 0, seq);
    let targets = tokens.narrow(1, 1, seq);
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
    let mut seconds = Vec::with_capacity(args.steps);
    for step in 1..=args.steps {
        let start = Instant::now();
        // Data: next-byte prediction over random windows of the text.
        let (inputs, targets) = batch::<B>(&mut rng, args.batch, args.seq, device);

        // Forward: logits `[batch, SEQ, vocab]`, the mean cross-entropy.
        let logits = model.forward(inputs);
        let loss = cross_entropy(logits, targets);
        let value: f32 = loss.clone().into_scalar().elem();
        println!("step {step:>4}  loss {value:.4}");

        // Backward: the gradients of the graph, keyed by parameter.
        let grads = GradientsParams::from_grads(loss.backward(), &model);

        // Update: the optimizer takes the model and gives back the new one.
        model = optim.step(args.lr, model, grads);
        seconds.push(start.elapsed().as_secs_f64());
    }
    // Steps after the first two (warm-up: kernels built, pools grown).
    let mut steady = seconds.iter().skip(2).copied().collect::<Vec<_>>();
    steady.sort_by(f64::total_cmp);
    if let Some(median) = steady.get(steady.len() / 2) {
        println!(
            "median step {median:.3} s, {:.0} tokens/s",
            (args.batch * args.seq) as f64 / median
        );
    }
    model
}

fn main() {
    let args = Args::parse();
    let config = args.config();
    println!(
        "{:?} Llama, {} layers, {} parameters; {} text bytes; uniform loss ln {} = {:.4}",
        args.shape,
        config.n_layer,
        config.num_params(),
        TEXT.len(),
        config.vocab_size,
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
