//! Trains the workspace's Llama with burn-train's `Learner` on burn-offload's
//! type parameter: `Autodiff<Offload<B>>` (`B` is [`trainer::DefaultBackend`],
//! burn-flex, or `Gemm<Cuda>` with `--features cuda`) with the host AdamW, so
//! the parameters and the optimizer's moments live in host memory and each
//! operation pages in the weights it reads.
//!
//! What the `Learner` does with devices, and why nothing extra is needed:
//! burn-train's default strategy (`SingleDeviceTrainingStrategy`, on the
//! device of the model's first parameter) calls `Module::fork(device)` once,
//! before the first epoch, and every parameter goes through
//! `to_device(device)`, `detach` and `require_grad`. On `Offload`, moving a
//! float tensor to the device parks it in host memory, and a host-resident
//! tensor already on that device is kept as it is, without a copy
//! (`float_to_device`), so the fork leaves the model host-resident. The
//! strategy also moves each batch with `to_device`, but token ids are int
//! tensors, the inner backend's own. Each step then ends in
//! `TrainStep::optimize`, i.e. the optimizer's `step`, and `HostParams` (what
//! `HostOptimizerConfig::init` returns) parks the updated parameters again;
//! validation runs on `valid()`, which strips autodiff and keeps the host
//! tensors. So the default strategy works unchanged. What is required is an
//! optimizer inside `HostParams`: burn-optim's own AdamW, unwrapped, would
//! hand back parameters computed on the device, and they would stay there.
//! The test checks residency where burn-train hands the model to us: at
//! every training step and in the model `launch` returns.
//!
//! Run: `cargo run -p learner` (about a second of training
//! on a CPU).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::{Device, TensorPrimitive};
use burn_offload::{AdamWConfig, BlockModel, BlockRecompute, HostOptimizerConfig, Offload};
use burn_train::metric::{LossMetric, Metric, MetricDefinition, MetricId, NumericEntry};
use burn_train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use burn_train::{
    InferenceStep, Learner, SequenceOutput, SupervisedTraining, TrainOutput, TrainStep,
};
use models::{cross_entropy, Llama, LlamaConfig};

/// What validation and inference run on: parameters in host memory.
type Inner = Offload<trainer::DefaultBackend>;
/// What training runs on.
type Train = Autodiff<Inner>;

/// Epochs `main` and the test train for: enough for the loss to fall from
/// `ln(256)` to well under half of it.
const EPOCHS: usize = 3;
/// Tokens of the corpus's repeating unit.
const PERIOD: usize = 64;
/// Tokens per window: 32 inputs and, shifted by one, 32 targets.
const WINDOW: usize = 33;
/// Windows per batch; the 64 training windows make 8 steps an epoch.
const BATCH: usize = 8;
/// Every `VALID_STRIDE`-th window is a validation window.
const VALID_STRIDE: usize = 4;
/// A constant learning rate; high for AdamW, which the tiny model and the
/// few steps allow.
const LR: f64 = 1e-2;
/// Seeds the weights and the order of the training windows.
const SEED: u64 = 42;

/// The repeating unit: 64 distinct tokens of the 256-token vocabulary, in a
/// scrambled order (37 is odd, so `37 i mod 256` never repeats for
/// `i < 256`). Each token has one successor, so the next token is learnable
/// and the loss can fall far below `ln(256)` within a few dozen steps.
fn pattern() -> Vec<i64> {
    let vocab = LlamaConfig::tiny().vocab_size;
    (0..PERIOD)
        .map(|i| ((37 * i + 11) % vocab) as i64)
        .collect()
}

/// The `WINDOW`-token window of the periodic corpus that starts at `start`.
fn window(pattern: &[i64], start: usize) -> Vec<i64> {
    (0..WINDOW).map(|k| pattern[(start + k) % PERIOD]).collect()
}

/// Training windows start at every offset of the period; validation takes
/// every `VALID_STRIDE`-th. The corpus is periodic, so the validation
/// windows are windows the model also trains on: its loss measures how well
/// the sequence is fitted, not generalisation.
fn windows() -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let pattern = pattern();
    let train = (0..PERIOD).map(|s| window(&pattern, s)).collect();
    let valid = (0..PERIOD)
        .step_by(VALID_STRIDE)
        .map(|s| window(&pattern, s))
        .collect();
    (train, valid)
}

/// A batch of windows: `targets` is `inputs` shifted by one token.
#[derive(Clone, Debug)]
pub struct TokenBatch<B: Backend> {
    pub inputs: Tensor<B, 2, Int>,
    pub targets: Tensor<B, 2, Int>,
}

/// Stacks `WINDOW`-token windows into a [`TokenBatch`].
#[derive(Clone, Debug)]
struct WindowBatcher;

impl<B: Backend> Batcher<B, Vec<i64>, TokenBatch<B>> for WindowBatcher {
    fn batch(&self, windows: Vec<Vec<i64>>, device: &B::Device) -> TokenBatch<B> {
        let rows = windows.len();
        let tokens: Vec<i64> = windows.into_iter().flatten().collect();
        let tokens =
            Tensor::<B, 2, Int>::from_data(TensorData::new(tokens, [rows, WINDOW]), device);
        TokenBatch {
            inputs: tokens.clone().slice([0..rows, 0..WINDOW - 1]),
            targets: tokens.slice([0..rows, 1..WINDOW]),
        }
    }
}

/// Batches of `windows` on `device`, in the order a `shuffle` seed gives, or
/// in order.
fn loader<B: Backend>(
    windows: Vec<Vec<i64>>,
    device: &Device<B>,
    shuffle: Option<u64>,
) -> Arc<dyn DataLoader<B, TokenBatch<B>>> {
    let builder = DataLoaderBuilder::new(WindowBatcher)
        .batch_size(BATCH)
        .set_device(device.clone());
    let builder = match shuffle {
        Some(seed) => builder.shuffle(seed),
        None => builder,
    };
    builder.build(InMemDataset::new(windows))
}

/// The Llama as burn-train sees it: a [`TrainStep`] on `Train` and an
/// [`InferenceStep`] on `Inner`, each giving the mean next-token loss with
/// the logits and targets.
#[derive(Module, Debug)]
pub struct LanguageModel<B: Backend> {
    llama: Llama<B>,
    /// Parameters found off the host at the start of a training step, summed
    /// over the steps; shared by every copy burn-train makes of the model
    /// (`fork`, `valid`, the optimizer's `map`), so the caller can read it.
    #[module(skip)]
    off_host: Arc<AtomicUsize>,
}

impl<B: BlockRecompute> LanguageModel<B> {
    fn forward(&self, batch: TokenBatch<B>) -> SequenceOutput<B> {
        let logits = self.llama.forward(batch.inputs);
        let loss = cross_entropy(logits.clone(), batch.targets.clone());
        SequenceOutput::new(loss, logits, None, batch.targets)
    }
}

impl TrainStep for LanguageModel<Train> {
    type Input = TokenBatch<Train>;
    type Output = SequenceOutput<Train>;

    fn step(&self, batch: TokenBatch<Train>) -> TrainOutput<SequenceOutput<Train>> {
        self.off_host
            .fetch_add(off_host_params(self), Ordering::Relaxed);
        let output = self.forward(batch);
        let grads = output.loss.backward();
        TrainOutput::new(self, grads, output)
    }
}

impl InferenceStep for LanguageModel<Inner> {
    type Input = TokenBatch<Inner>;
    type Output = SequenceOutput<Inner>;

    fn step(&self, batch: TokenBatch<Inner>) -> SequenceOutput<Inner> {
        self.forward(batch)
    }
}

/// Counts the float parameters that are not host-resident, and all of them.
#[derive(Default)]
struct Residency {
    params: usize,
    off_host: usize,
}

impl Residency {
    fn count(&mut self, primitive: TensorPrimitive<Inner>) {
        self.params += 1;
        if !matches!(primitive, TensorPrimitive::Float(t) if t.is_host()) {
            self.off_host += 1;
        }
    }
}

impl ModuleVisitor<Train> for Residency {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Train, D>>) {
        self.count(param.val().inner().into_primitive());
    }
}

impl ModuleVisitor<Inner> for Residency {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Inner, D>>) {
        self.count(param.val().into_primitive());
    }
}

/// How many of `model`'s float parameters are not host-resident.
fn off_host_params<B: Backend, M: Module<B>>(model: &M) -> usize
where
    Residency: ModuleVisitor<B>,
{
    let mut residency = Residency::default();
    model.visit(&mut residency);
    residency.off_host
}

/// The loss values the `Learner` reports, per batch: `(epoch, loss, windows)`.
#[derive(Debug, Default, Clone)]
struct Losses {
    train: Vec<(usize, f64, usize)>,
    valid: Vec<(usize, f64, usize)>,
}

/// A renderer that records the loss metric instead of drawing it. Without
/// burn-train's `tui` feature (left off: it needs a terminal) the default
/// renderer prints a debug line per batch and keeps no values; this one runs
/// headless and quiet, and hands the numbers back through `losses`, which
/// the caller shares (the renderer itself moves into burn-train's metrics
/// thread).
struct LossRecorder {
    losses: Arc<Mutex<Losses>>,
    /// The name burn-train registers the loss metric under.
    name: String,
    /// Its id, once registered.
    id: Option<MetricId>,
    /// The current batch's `(loss, windows)`: metrics arrive before the
    /// progress that says which epoch the batch belongs to.
    pending: Option<(f64, usize)>,
}

impl LossRecorder {
    fn update(&mut self, state: MetricState) {
        if let MetricState::Numeric(entry, value) = state {
            if self.id.as_ref() == Some(&entry.metric_id) {
                self.pending = Some(match value {
                    NumericEntry::Value(loss) => (loss, 1),
                    NumericEntry::Aggregated {
                        aggregated_value,
                        count,
                    } => (aggregated_value, count),
                });
            }
        }
    }

    fn render(&mut self, item: &TrainingProgress, valid: bool) {
        if let Some((loss, windows)) = self.pending.take() {
            let epoch = item.global_progress.items_processed;
            let mut losses = self.losses.lock().unwrap_or_else(PoisonError::into_inner);
            let split = if valid {
                &mut losses.valid
            } else {
                &mut losses.train
            };
            split.push((epoch, loss, windows));
        }
    }
}

impl MetricsRendererTraining for LossRecorder {
    fn update_train(&mut self, state: MetricState) {
        self.update(state);
    }

    fn update_valid(&mut self, state: MetricState) {
        self.update(state);
    }

    fn render_train(&mut self, item: TrainingProgress, _: Vec<ProgressType>) {
        self.render(&item, false);
    }

    fn render_valid(&mut self, item: TrainingProgress, _: Vec<ProgressType>) {
        self.render(&item, true);
    }
}

impl MetricsRendererEvaluation for LossRecorder {
    fn update_test(&mut self, _: EvaluationName, _: MetricState) {}

    fn render_test(&mut self, _: EvaluationProgress, _: Vec<ProgressType>) {}
}

impl MetricsRenderer for LossRecorder {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        if definition.name == self.name {
            self.id = Some(definition.metric_id);
        }
    }
}

/// One epoch's mean losses, weighted by windows.
#[derive(Debug, Clone, Copy)]
pub struct EpochLoss {
    pub train: f64,
    pub valid: f64,
}

/// What a run reports.
#[derive(Debug)]
pub struct Report {
    /// The training loss of each step, in order.
    pub step_losses: Vec<f64>,
    /// Each epoch's mean training and validation loss.
    pub epochs: Vec<EpochLoss>,
    /// Float parameters of the model.
    pub params: usize,
    /// Parameters found off the host at the start of a step, summed over steps.
    pub off_host_during_training: usize,
    /// Parameters off the host in the model `launch` returned.
    pub off_host_after_training: usize,
}

impl Report {
    /// The loss of the first step, before any update.
    pub fn first_loss(&self) -> f64 {
        self.step_losses.first().copied().unwrap_or(f64::NAN)
    }

    /// The last epoch's validation loss.
    pub fn last_loss(&self) -> f64 {
        self.epochs.last().map_or(f64::NAN, |e| e.valid)
    }
}

/// The mean loss of each epoch in `batches`, weighted by windows.
fn epoch_means(batches: &[(usize, f64, usize)], epochs: usize) -> Vec<f64> {
    (1..=epochs)
        .map(|epoch| {
            let (sum, n) = batches
                .iter()
                .filter(|(e, _, _)| *e == epoch)
                .fold((0.0, 0), |(sum, n), (_, loss, w)| {
                    (sum + loss * *w as f64, n + w)
                });
            sum / n as f64
        })
        .collect()
}

/// Trains the tiny Llama for `epochs` epochs with burn-train's `Learner`,
/// writing the Learner's metric logs under `artifacts`.
pub fn train(epochs: usize, artifacts: &Path) -> Report {
    let device = Device::<Inner>::default();
    Inner::seed(&device, SEED);
    let off_host = Arc::new(AtomicUsize::new(0));
    let model = LanguageModel {
        llama: LlamaConfig::tiny().init::<Train>(&device),
        off_host: off_host.clone(),
    };
    let optim =
        HostOptimizerConfig::adamw(AdamWConfig::default()).init::<Train, LanguageModel<Train>>();

    let (train_windows, valid_windows) = windows();
    let train_loader = loader::<Train>(train_windows, &device, Some(SEED));
    let valid_loader = loader::<Inner>(valid_windows, &device, None);

    let losses = Arc::new(Mutex::new(Losses::default()));
    let loss_metric = LossMetric::<Flex>::new();
    let recorder = LossRecorder {
        losses: losses.clone(),
        name: loss_metric.name().to_string(),
        id: None,
        pending: None,
    };
    let result = SupervisedTraining::new(artifacts, train_loader, valid_loader)
        .metrics((loss_metric,))
        .num_epochs(epochs)
        .renderer(recorder)
        // The default installs a process-wide tracing subscriber and panic
        // hook that log to `artifacts`: not for a function tests call.
        .with_application_logger(None)
        .launch(Learner::new(model, optim, LR));

    let losses = losses
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let train = epoch_means(&losses.train, epochs);
    let valid = epoch_means(&losses.valid, epochs);
    let mut residency = Residency::default();
    result.model.visit(&mut residency);
    Report {
        step_losses: losses.train.iter().map(|(_, loss, _)| *loss).collect(),
        epochs: train
            .into_iter()
            .zip(valid)
            .map(|(train, valid)| EpochLoss { train, valid })
            .collect(),
        params: residency.params,
        off_host_during_training: off_host.load(Ordering::Relaxed),
        off_host_after_training: residency.off_host,
    }
}

fn main() {
    let artifacts =
        tempfile::tempdir().expect("cannot create a temporary folder for the Learner's logs");
    let start = Instant::now();
    let report = train(EPOCHS, artifacts.path());
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{} steps in {seconds:.1} s; first step's loss {:.3} (ln 256 = {:.3})",
        report.step_losses.len(),
        report.first_loss(),
        (LlamaConfig::tiny().vocab_size as f64).ln()
    );
    for (i, epoch) in report.epochs.iter().enumerate() {
        println!(
            "epoch {}: train loss {:.3}, valid loss {:.3}",
            i + 1,
            epoch.train,
            epoch.valid
        );
    }
    let paged = burn_offload::residency::stats();
    println!(
        "parameters off the host: {} at step starts, {} of {} after training; {:.1} MB paged in",
        report.off_host_during_training,
        report.off_host_after_training,
        report.params,
        paged.bytes_to_device as f64 / 1e6
    );
    println!(
        "blocks recomputed in the backward: {}; device peak {:.1} MB",
        burn_offload::recomputed_blocks(),
        paged.peak_device_bytes as f64 / 1e6
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learner_trains_on_offload() {
        let artifacts = tempfile::tempdir().unwrap();
        let report = train(EPOCHS, artifacts.path());
        eprintln!("{report:?}");

        let steps = EPOCHS * PERIOD.div_ceil(BATCH);
        assert_eq!(report.step_losses.len(), steps, "one loss per step");
        let (first, last) = (report.first_loss(), report.last_loss());
        let uniform = (LlamaConfig::tiny().vocab_size as f64).ln();
        assert!(
            (first - uniform).abs() < 0.2,
            "an untrained model starts near ln(vocab) = {uniform}: {first}"
        );
        assert!(last < 0.5 * first, "loss did not fall: {first} -> {last}");
        let train: Vec<f64> = report.epochs.iter().map(|e| e.train).collect();
        assert!(
            train.windows(2).all(|w| w[1] < w[0]),
            "training loss not falling epoch by epoch: {train:?}"
        );

        assert!(report.params > 0);
        assert_eq!(
            report.off_host_during_training, 0,
            "parameters on the device at the start of a step"
        );
        assert_eq!(
            report.off_host_after_training, 0,
            "parameters on the device after training"
        );
    }
}
