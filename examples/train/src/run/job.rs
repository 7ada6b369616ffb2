//! A run once set up: the engine's loop and the resident loop, and what
//! both do around a step (schedule, checkpoints, export, sample, log).

use std::path::PathBuf;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::module::HasAutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::tensor::backend::{AutodiffBackend, ExecutionError};
use burn::tensor::{ElementConversion, TensorData};
use burn_offload::checkpoint::{CheckpointDir, CheckpointError};
use burn_offload::{
    BlockModel, BlockRecompute, Compute, DecoderBlock, Documents, Engine, EngineConfig,
    EngineError, HostValues, NoHostValues, OptimizerConfig,
};
use models::hf::{CheckpointValues, HfError};
use models::lora::{LoraConfig, LoraModel};
use models::{cross_entropy, ModelConfig};

use super::lora;
use super::machine::*;
use super::resume::*;
use super::state::*;
use crate::data::{trained_targets, Batcher, EvalBatch, EvalWindows};
use crate::export::{self, ExportError};
use crate::metrics::*;
use crate::options::*;
use crate::outputs::{MetricsFile, OutputError, ResumeMarker};
use crate::plan::OptimState;
use crate::processes::{agree_on_signal, RankError};
use crate::progress::{human_count, Progress, StepLine};
use crate::sample::*;
use crate::schedule::WarmupCosine;
use crate::signals;
use crate::tokenizer::Tokenizer;
use crate::{peak_rss_bytes, process_rss_bytes};
use burn_offload::ops::cross_entropy::nll_sum;
use burn_offload::trace;
use burn_offload::ProcessGroup;

/// Why training stopped with an error once it had begun: a loss or
/// gradient that would not stay finite, or what the engine, the outputs or
/// the other processes reported (in their own words).
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(
        "loss became {loss} at step {step} and --no-guard applied the update; resume from the \
         last checkpoint with a lower --lr"
    )]
    UnguardedNonFinite { loss: f32, step: usize },
    #[error(
        "stopped: {skips} consecutive steps had a non-finite loss or gradient (last loss {loss}, \
         gradient norm {grad_norm}); parameters are as after step {after}; lower --lr or check \
         the data"
    )]
    TooManySkips {
        skips: usize,
        loss: f32,
        grad_norm: f64,
        after: usize,
    },
    #[error("loss became {loss} at step {step}; try a lower --lr")]
    NonFinite { loss: f32, step: usize },
    #[error("device sync failed: {0:?}")]
    DeviceSync(ExecutionError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Processes(#[from] RankError),
    #[error(transparent)]
    Export(#[from] ExportError),
    /// `--init-from`'s config.json, read again for the export.
    #[error(transparent)]
    SourceConfig(#[from] HfError),
    /// The trainer state a checkpoint records did not serialise.
    #[error(transparent)]
    State(#[from] serde_json::Error),
}

/// What the resident loop leaves after its last step.
pub(super) struct Finished {
    exported: Option<PathBuf>,
    adapters: Option<PathBuf>,
    sample: String,
}

pub(crate) struct Job<'a> {
    pub(crate) opts: &'a TrainOptions,
    pub(crate) tokenizer: &'a Tokenizer,
    pub(crate) batcher: Batcher,
    pub(crate) metrics: Option<MetricsFile>,
    /// The checkpoint folder, locked for this run.
    pub(crate) checkpoints: Option<CheckpointDir>,
    /// The checkpoint the run continues from, already checked against it.
    pub(crate) resume: Option<Resume>,
    pub(crate) config: ModelConfig,
    /// (tokens, crc32) of the training token stream.
    pub(crate) corpus: (usize, u32),
    /// The blocks whose input checkpoints stay on the device, the others'
    /// going to host memory (decided by the memory plan).
    pub(crate) device_checkpoints: usize,
    /// Blocks whose forward graph the engine keeps (decided by the memory plan).
    pub(crate) kept_graphs: usize,
    /// How many recomputed blocks keep their attention outputs (decided by
    /// the memory plan).
    pub(crate) kept_attention: usize,
    /// Blocks whose gradients may wait on the device (counted by the memory plan).
    pub(crate) gradient_blocks_in_flight: usize,
    /// The compact host layout: weights cast on the device (decided by the
    /// memory plan).
    pub(crate) cast_on_device: bool,
    /// With it and one micro-batch, the blocks' gradients kept in the compute
    /// precision (decided by the memory plan).
    pub(crate) compute_precision_gradients: bool,
    /// When the model began to be built (initialisation time is reported).
    pub(crate) building: Instant,
    /// The run's processes, when it has several.
    pub(crate) group: Option<Arc<ProcessGroup>>,
    /// What the sample after training continues: the data's first tokens,
    /// or for instruction data an example's prompt.
    pub(crate) sample_prompt: Vec<u32>,
    /// The held-out windows the run evaluates on.
    pub(crate) eval: Option<EvalWindows>,
    /// The lowest eval loss so far (before a resume too).
    pub(crate) best: Option<BestEval>,
    /// The LoRA adapters the model carries (`--lora-rank`).
    pub(crate) lora: Option<LoraConfig>,
    /// What its checkpoints record of the adapters and their base.
    pub(crate) adapter_run: Option<AdapterRun>,
}

impl Job<'_> {
    pub(super) fn schedule(&self) -> WarmupCosine {
        WarmupCosine {
            peak: self.opts.lr(),
            warmup: self.opts.warmup.min(self.opts.steps),
            total: self.opts.steps,
            min_ratio: self.opts.min_lr_ratio,
        }
    }

    pub(super) fn state(&self, steps_done: usize, skipped_total: usize) -> TrainerState {
        TrainerState {
            model: self.config.clone(),
            tokenizer: self.tokenizer.name().to_string(),
            batch: self.opts.batch,
            seq_len: self.opts.seq_len,
            accum: self.opts.accum,
            gpus: self.opts.gpus,
            processes: world_size(self.opts),
            steps_done,
            skipped_total,
            batcher_rng: self.batcher.rng_state(),
            corpus_tokens: self.corpus.0,
            corpus_crc32: self.corpus.1,
            best_eval: self.best,
            adapters: self.adapter_run.clone(),
        }
    }

    /// Offload engine: parameters and AdamW state in host slabs, blocks streamed.
    pub(super) fn train_engine<B, M>(
        mut self,
        (model, rng, values): (M, MutexGuard<'static, ()>, Option<CheckpointValues>),
        devices: &[B::Device],
    ) -> Result<Outcome, JobError>
    where
        B: Backend,
        M: BlockModel<B> + LoraModel<B> + HasAutodiffModule<Autodiff<B>>,
        M::TrainModule: BlockModel<Autodiff<B>>,
        M::Block: HasAutodiffModule<Autodiff<B>>,
        <M::Block as HasAutodiffModule<Autodiff<B>>>::TrainModule: DecoderBlock<Autodiff<B>>,
    {
        let opts = self.opts;
        let config = EngineConfig {
            optimizer: OptimizerConfig::AdamW(opts.adamw()),
            grad_clip: (opts.grad_clip > 0.0).then_some(opts.grad_clip),
            fused: opts.fused,
            loss_chunk_tokens: opts.loss_chunk_tokens,
            skip_non_finite: !opts.no_guard,
            overlap: !opts.serial_copies,
            device_checkpoints: self.device_checkpoints,
            compute: opts.compute,
            cast_on_device: self.cast_on_device,
            compute_precision_gradients: self.compute_precision_gradients,
            eight_bit_moments: opts.optim_state == OptimState::EightBit,
            kept_graphs: self.kept_graphs,
            kept_attention: self.kept_attention,
            blocking_sync: !opts.spin_waits,
            hold_updates_for_copies: !opts.updates_during_copies,
            gradient_blocks_in_flight: self.gradient_blocks_in_flight,
        };
        let device = &devices[0];
        let frozen = lora::frozen(&model, self.lora.as_ref(), opts);
        let values: &dyn HostValues = match &values {
            Some(values) => values,
            None => &NoHostValues,
        };
        let mut engine = Engine::with_host_values(model, values, frozen.as_ref(), config, devices)?;
        drop(rng);
        trace::mark("host store ready");
        if opts.progress {
            let copies = engine.compute_copy_bytes();
            let store = engine.store();
            let frozen = match store.num_frozen() {
                0 => String::new(),
                n => format!(" and {} frozen", human_count(n)),
            };
            eprintln!(
                "host store ready: {} trained parameters{frozen}, {:.2} GiB ({:.1} B/param) in {:.1} s; host peak so far {:.2} GiB",
                human_count(store.num_params()),
                store.host_bytes() as f64 / GIB,
                store.bytes_per_param(),
                self.building.elapsed().as_secs_f64(),
                peak_rss_bytes().unwrap_or(0) as f64 / GIB,
            );
            if self.kept_graphs > 0 {
                eprintln!(
                    "the last {} of {} blocks keep their forward graph on the device (not recomputed)",
                    self.kept_graphs,
                    self.config.n_layer()
                );
            }
            if self.kept_attention > 0 {
                let recomputed =
                    self.config.n_layer() - self.kept_graphs.min(self.config.n_layer());
                eprintln!(
                    "{} of {recomputed} recomputed blocks take their attention outputs from the forward",
                    self.kept_attention.min(recomputed)
                );
            }
            let layers = self.config.n_layer();
            if self.device_checkpoints > 0 && self.device_checkpoints < layers {
                eprintln!(
                    "block inputs in host memory, but the last {} recomputed blocks' on the device (the host cannot hold them all)",
                    self.device_checkpoints
                );
            }
            if copies > 0 {
                eprintln!(
                    "{} weights for upload: {:.2} GiB beside the fp32 store",
                    opts.compute,
                    copies as f64 / GIB
                );
            }
        }
        let mut outcome = Outcome::default();
        if let Some(resume) = self.resume.take() {
            engine.load_checkpoint(&resume.path)?;
            self.batcher.set_rng_state(resume.state.batcher_rng);
            self.best = resume.state.best_eval;
            self.pin_resumed_best()?;
            outcome.start_step = resume.state.steps_done;
            outcome.skipped_total = resume.state.skipped_total;
            if let Some(metrics) = self.metrics.as_mut() {
                metrics.line(&ResumeMarker {
                    resumed_from: &resume.path,
                    step: outcome.start_step,
                })?;
            }
            if opts.progress {
                eprintln!(
                    "resumed from `{}` at step {} of {}",
                    resume.path.display(),
                    outcome.start_step,
                    opts.steps
                );
            }
        }
        // Every process holds the same store from here on (checked).
        if let Some(group) = &self.group {
            engine.join_processes(group.clone())?;
        }
        let schedule = self.schedule();
        let mut progress = self.progress(outcome.start_step);
        let lanes = devices.len() * world_size(opts);
        let tokens_per_step = (opts.batch * opts.seq_len * opts.accum * lanes) as f64;
        // Forward and the input gradients run through every weight, the
        // weight gradients only for the trained ones (a LoRA base is frozen).
        let store = engine.store();
        let trained = store.num_params() as u64;
        let params = trained + store.num_frozen() as u64;
        let stem = &store.groups[0];
        let block_params = params - (stem.numel() + stem.frozen.numel()) as u64;
        let config = engine.config();
        let passes = if config.fused && (config.grad_clip.is_some() || config.skip_non_finite) {
            2.0
        } else {
            1.0
        };
        let model_flops = (4.0 * params as f64 + 2.0 * trained as f64) * tokens_per_step;
        // The recompute covers the blocks whose graph the forward did not keep.
        let blocks = self.config.n_layer();
        let recomputed_blocks = blocks - config.kept_graphs.min(blocks);
        let recomputed = recomputed_blocks as f64 / blocks.max(1) as f64;
        // Those that take their attention outputs from the forward skip
        // attention's forward in the recompute.
        let attention_recomputed =
            (recomputed_blocks - config.kept_attention.min(recomputed_blocks)) as f64
                / blocks.max(1) as f64;
        // Causal attention's products, `seq² × width` FLOPs each a sequence
        // and layer (half the square's multiply-adds): two forward, two more
        // where the block's attention is recomputed, five backward (the
        // scores again, the probabilities', values', queries' and keys'
        // gradients).
        let sequences = (opts.batch * opts.accum * lanes) as f64;
        let attention_product = sequences
            * (opts.seq_len as f64).powi(2)
            * self.config.attention_width() as f64
            * blocks as f64;
        let hardware_flops = passes
            * (model_flops
                + 2.0 * recomputed * block_params as f64 * tokens_per_step
                + (7.0 + 2.0 * attention_recomputed) * attention_product);
        let mut consecutive_skips = 0;
        let mut step = outcome.start_step;
        // Steps done since the last checkpoint was written.
        let mut unsaved = false;
        loop {
            // The one way out: the end, --stop-after or a signal, each with
            // a checkpoint of whatever is not saved yet.
            // Every process stops at the same step, with rank 0's checkpoint.
            let signal = match &self.group {
                Some(group) => agree_on_signal(group, signals::requested())?,
                None => signals::requested(),
            };
            if signal.is_some() || step == opts.steps || opts.stop_after == Some(step) {
                if unsaved {
                    outcome.checkpoint = self
                        .checkpoint(step, outcome.skipped_total, |dir, state| {
                            engine.save_checkpoint(dir, state)
                        })?
                        .or(outcome.checkpoint);
                }
                outcome.interrupted = signal;
                break;
            }
            let started = Instant::now();
            let lr = schedule.lr(step);
            // Rounds of one micro-batch per lane of the run, each drawn on
            // its device (every process draws them all).
            let mut trained_tokens = 0;
            let mut documents = Vec::new();
            let batches: Vec<_> = (0..opts.accum * lanes)
                .map(|i| {
                    let (inputs, targets, trained, docs) =
                        self.batch_tensors::<B>(&devices[i % devices.len()]);
                    trained_tokens += trained;
                    documents.extend(docs);
                    (inputs, targets)
                })
                .collect();
            if opts.poison_at_step == Some(step) {
                engine.store_mut().groups[0]
                    .params
                    .as_mut_slice()
                    .fill(f32::NAN);
            }
            engine.reset_pager_counters();
            let peak_reset = trace::reset_peak();
            trace::mark(format_args!("step {step}: batches ready"));
            // Packed instruction windows carry their examples' boundaries
            // (every micro-batch of the batcher, or none).
            let report = if documents.len() == batches.len() {
                engine.step_in(&batches, &documents, lr)?
            } else {
                engine.step(&batches, lr)?
            };
            if report.skipped {
                consecutive_skips += 1;
                outcome.skipped_total += 1;
            } else {
                consecutive_skips = 0;
            }
            if opts.no_guard && !report.loss.is_finite() {
                return Err(JobError::UnguardedNonFinite {
                    loss: report.loss,
                    step,
                });
            }
            outcome.losses.push(report.loss);
            let pager = engine.pager_stats();
            let step_s = started.elapsed().as_secs_f64();
            let tokens_per_s = tokens_per_step / step_s;
            self.log(&StepMetrics {
                step,
                loss: report.loss,
                trained_tokens,
                lr,
                tokens_per_s,
                step_s,
                params,
                model_tflops: model_flops / step_s * 1e-12,
                hardware_tflops: hardware_flops / step_s * 1e-12,
                rss_bytes: process_rss_bytes(),
                rss_peak_bytes: peak_reset.then(peak_rss_bytes).flatten(),
                grad_norm: report.grad_norm.is_finite().then_some(report.grad_norm),
                bytes_to_device: Some(pager.bytes_to_device),
                bytes_to_host: Some(pager.bytes_to_host),
                peak_device_param_bytes: Some(pager.peak_resident_bytes),
                upload_wait_s: Some(pager.upload_wait_ns as f64 * 1e-9),
                split: Some(report.split),
                gpu_reserved_bytes: gpu_reserved_bytes(opts),
                host_update_s: None,
                paged_in_bytes: None,
                skipped: report.skipped,
                skipped_total: outcome.skipped_total,
            })?;
            if consecutive_skips >= opts.max_skips {
                return Err(JobError::TooManySkips {
                    skips: consecutive_skips,
                    loss: report.loss,
                    grad_norm: report.grad_norm,
                    after: step + 1 - consecutive_skips,
                });
            }
            trace::mark(format_args!("step {step}: logged"));
            progress.step(StepLine {
                done: step + 1,
                loss: report.loss,
                tokens_per_s,
                trained_tokens,
            });
            step += 1;
            unsaved = true;
            signals::update(|progress| progress.steps_done = step);
            let mut new_best = false;
            if self.eval_due(step) {
                let nll = |batch: &EvalBatch| {
                    let [inputs, targets] = batch.tensors::<B>(device);
                    Ok(engine.nll_sum(&inputs, &targets, batch.documents.as_ref())?)
                };
                if let Some(evaluation) = self.evaluate(nll)? {
                    new_best = self.evaluated(step, evaluation, &mut progress)?;
                    outcome.evaluations.push((step, evaluation));
                }
            }
            let keep_best = new_best && opts.keep_best;
            if keep_best || (opts.checkpoint_every > 0 && step % opts.checkpoint_every == 0) {
                outcome.checkpoint =
                    self.checkpoint(step, outcome.skipped_total, |dir, state| {
                        engine.save_checkpoint(dir, state)
                    })?;
                unsaved = false;
                if keep_best {
                    self.pin_best(outcome.checkpoint.clone())?;
                }
            }
        }
        progress.finish();
        outcome.best_eval = self.best;
        if outcome.interrupted.is_some() {
            // Stop promptly: the run is not finished, so neither export nor sample.
            return Ok(outcome);
        }
        if !writes_outputs(opts) {
            return Ok(outcome);
        }
        if self.opts.export_hf.is_some() {
            // The export needs the whole model as burn modules on the device.
            let model = engine.model();
            outcome.exported = match self.lora {
                Some(_) => self.export(&model.merge_lora())?,
                None => self.export(&model)?,
            };
        }
        if let Some(config) = &self.lora {
            outcome.adapters = lora::export_peft(opts, &engine.trained_model(), config)?;
        }
        if !outcome.losses.is_empty() {
            // Sampling streams the blocks like training does: a model larger
            // than the device is never assembled on it.
            outcome.sample = self.sample(device, |tokens| Ok(engine.last_logits(&tokens)?))?;
        }
        Ok(outcome)
    }

    /// Writes a checkpoint after `steps_done` steps with `save` (the engine's),
    /// when the run has a checkpoint folder; returns its path.
    pub(super) fn checkpoint(
        &mut self,
        steps_done: usize,
        skipped_total: usize,
        save: impl FnOnce(&mut CheckpointDir, serde_json::Value) -> Result<PathBuf, CheckpointError>,
    ) -> Result<Option<PathBuf>, JobError> {
        let state = serde_json::to_value(self.state(steps_done, skipped_total))?;
        let Some(dir) = self.checkpoints.as_mut() else {
            return Ok(None);
        };
        let path = save(dir, state)?;
        signals::update(|progress| progress.saved = Some((path.clone(), steps_done)));
        Ok(Some(path))
    }

    /// Writes `model` to `--export-hf` as a whole Hugging Face folder (see
    /// [`export`]); returns where it went.
    pub(super) fn export<B: Backend, M: burn::module::Module<B>>(
        &self,
        model: &M,
    ) -> Result<Option<PathBuf>, JobError> {
        let Some(dir) = &self.opts.export_hf else {
            return Ok(None);
        };
        let init_from = self.opts.init_from.as_deref();
        let source_config = match init_from {
            Some(dir) => Some(models::hf::read_json(&dir.join("config.json"))?),
            None => None,
        };
        let ids = export::special_token_ids(source_config.as_ref(), self.tokenizer);
        export::write(export::HF, dir, |staging| {
            models::hf::save_weights(model, &self.config, staging)?;
            export::write_configs(
                staging,
                models::hf::hf_config(&self.config),
                &ids,
                init_from,
            )?;
            for file in self.tokenizer.files() {
                let name = file.file_name().expect("a file");
                std::fs::copy(file, staging.join(name)).map_err(|error| ExportError::Copy {
                    to: export::HF,
                    file: file.clone(),
                    error,
                })?;
            }
            Ok(())
        })?;
        Ok(Some(dir.clone()))
    }

    /// The resident model's exports (with adapters: `--export-hf` of the
    /// merged model, `--export-peft` of the adapters) and sample.
    pub(super) fn finish<B: Backend, M: BlockModel<B> + LoraModel<B> + Clone>(
        &mut self,
        model: &M,
        device: &B::Device,
    ) -> Result<Finished, JobError> {
        let (exported, adapters) = match &self.lora {
            Some(config) => (
                self.export(&model.clone().merge_lora())?,
                lora::export_peft(self.opts, model, config)?,
            ),
            None => (self.export(model)?, None),
        };
        let sample = self.sample(device, |tokens| Ok(last_logits(model, tokens)))?;
        Ok(Finished {
            exported,
            adapters,
            sample,
        })
    }

    /// Text generated from the data's prompt with `logits` (last-position
    /// logits of a batch of one); empty with `--sample-tokens 0`.
    pub(super) fn sample<B: Backend>(
        &self,
        device: &B::Device,
        logits: impl FnMut(Tensor<B, 2, Int>) -> Result<Tensor<B, 2>, JobError>,
    ) -> Result<String, JobError> {
        let opts = self.opts;
        let settings = SampleSettings {
            tokens: opts.sample_tokens,
            seq_len: opts.seq_len,
            temperature: opts.temperature,
            seed: opts.seed,
        };
        sample(
            logits,
            self.tokenizer,
            &self.sample_prompt,
            settings,
            device,
        )
    }

    /// Plain burn: `Autodiff` over the whole model and `optim` (burn-optim's
    /// AdamW, or the host AdamW over `Offload<B>`; clipping per parameter
    /// tensor, not global). In bf16 the f32 parameters are cast for each
    /// forward and the gradients arrive in f32.
    pub(super) fn train_resident<AB, M, O>(
        mut self,
        mut model: M,
        mut optim: O,
        device: &AB::Device,
    ) -> Result<Outcome, JobError>
    where
        AB: AutodiffBackend + BlockRecompute,
        AB::InnerBackend: BlockRecompute,
        M: BlockModel<AB> + AutodiffModule<AB>,
        M::InnerModule: BlockModel<AB::InnerBackend> + LoraModel<AB::InnerBackend> + Clone,
        O: Optimizer<M, AB>,
    {
        let opts = self.opts;
        let schedule = self.schedule();
        let mut progress = self.progress(0);
        let tokens_per_step = (opts.batch * opts.seq_len * opts.accum) as f64;
        let params = model.num_params() as u64;
        let flops = 6.0 * params as f64 * tokens_per_step;
        let mut losses = Vec::with_capacity(opts.steps);
        let mut evaluations = Vec::new();
        // With --accum the graph holds one micro-batch's activations at a
        // time; the gradients are summed into a second set of parameter-sized
        // tensors (burn's accumulator, which takes a single micro-batch's as
        // they are), each micro-batch's mean loss weighted by its share of
        // the step's trained targets, so the sum is the mean over the step's
        // trained tokens, as in the engine.
        let mut accumulator = GradientsAccumulator::<M>::new();
        // BURN_OFFLOAD_RESIDENT_SPLIT=1: wait for the device after each
        // phase, so the step's split (forward with head and loss, backward,
        // optimizer) is device time, to set beside the engine's. The waits
        // cost the overlap of one phase's launches with the last one's tail,
        // so these rows are for the split, not for tokens/s.
        let timed = std::env::var("BURN_OFFLOAD_RESIDENT_SPLIT").is_ok_and(|v| v == "1");
        let mark = |to: &mut f64, since: &mut Instant| -> Result<(), JobError> {
            if timed {
                AB::sync(device).map_err(JobError::DeviceSync)?;
                *to += since.elapsed().as_secs_f64();
                *since = Instant::now();
            }
            Ok(())
        };

        for step in 0..opts.steps {
            if let Some(signal) = signals::requested() {
                // No checkpoints in this mode: stop, without export or sample.
                progress.finish();
                return Ok(Outcome {
                    losses,
                    interrupted: Some(signal),
                    ..Outcome::default()
                });
            }
            let started = Instant::now();
            let (updating, paged) = (
                burn_offload::host_update_stats().updating,
                burn_offload::residency::stats().bytes_to_device,
            );
            let mut phase = Instant::now();
            let mut split = burn_offload::StepSplit::default();
            let lr = schedule.lr(step);
            let mut loss_value = 0.0f32;
            let micro_batches: Vec<_> = (0..opts.accum)
                .map(|_| self.batcher.next_batch_in(opts.batch))
                .collect();
            let trained_tokens: usize = micro_batches
                .iter()
                .map(|(_, t, _)| trained_targets(t))
                .sum();
            for (inputs, targets, documents) in micro_batches {
                let scale = trained_targets(&targets) as f64 / trained_tokens.max(1) as f64;
                let tensor = |v: Vec<i64>| {
                    Tensor::from_data(TensorData::new(v, [opts.batch, opts.seq_len]), device)
                };
                let (inputs, targets) = (tensor(inputs), tensor(targets));
                // Packed instruction windows: each example sees only itself.
                let forward = |model: &M| match &documents {
                    Some(documents) => model.forward_in(inputs.clone(), documents),
                    None => model.forward(inputs.clone()),
                };
                let logits = match opts.compute {
                    Compute::Fp32 => forward(&model),
                    low => forward(&burn_offload::cast_params(model.clone(), low.dtype())),
                };
                let loss = cross_entropy(logits, targets) * scale;
                let micro: f32 = loss.clone().into_scalar().elem();
                mark(&mut split.forward_s, &mut phase)?;
                if !micro.is_finite() {
                    return Err(JobError::NonFinite { loss: micro, step });
                }
                loss_value += micro;
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                accumulator.accumulate(&model, grads);
                mark(&mut split.backward_s, &mut phase)?;
            }
            model = optim.step(lr, model, accumulator.grads());
            mark(&mut split.optimizer_s, &mut phase)?;
            losses.push(loss_value);

            let step_s = started.elapsed().as_secs_f64();
            let tokens_per_s = tokens_per_step / step_s;
            let line = StepMetrics {
                step,
                loss: loss_value,
                trained_tokens,
                lr,
                tokens_per_s,
                step_s,
                params,
                model_tflops: flops / step_s * 1e-12,
                hardware_tflops: flops / step_s * 1e-12,
                rss_bytes: process_rss_bytes(),
                rss_peak_bytes: None,
                grad_norm: None,
                bytes_to_device: None,
                bytes_to_host: None,
                peak_device_param_bytes: None,
                upload_wait_s: None,
                split: timed.then_some(split),
                gpu_reserved_bytes: gpu_reserved_bytes(opts),
                host_update_s: opts
                    .host_params
                    .then(|| (burn_offload::host_update_stats().updating - updating).as_secs_f64()),
                paged_in_bytes: opts
                    .host_params
                    .then(|| burn_offload::residency::stats().bytes_to_device - paged),
                skipped: false,
                skipped_total: 0,
            };
            self.log(&line)?;
            progress.step(StepLine {
                done: step + 1,
                loss: loss_value,
                tokens_per_s,
                trained_tokens,
            });
            signals::update(|progress| progress.steps_done = step + 1);
            if self.eval_due(step + 1) {
                let valid = match opts.compute {
                    Compute::Fp32 => model.valid(),
                    low => burn_offload::cast_params(model.valid(), low.dtype()),
                };
                let nll = |batch: &EvalBatch| {
                    let [inputs, targets] = batch.tensors::<AB::InnerBackend>(device);
                    let logits = match &batch.documents {
                        Some(documents) => valid.forward_in(inputs, documents),
                        None => valid.forward(inputs),
                    };
                    Ok(nll_sum(logits, targets).into_scalar().elem::<f64>())
                };
                if let Some(evaluation) = self.evaluate(nll)? {
                    self.evaluated(step + 1, evaluation, &mut progress)?;
                    evaluations.push((step + 1, evaluation));
                }
            }
        }
        progress.finish();
        let finished = self.finish(&model.valid(), device)?;
        Ok(Outcome {
            losses,
            sample: finished.sample,
            exported: finished.exported,
            adapters: finished.adapters,
            evaluations,
            best_eval: self.best,
            ..Outcome::default()
        })
    }

    /// The next micro-batch on `device`, with the number of targets it
    /// trains on and its rows' document boundaries (packed instruction data).
    pub(super) fn batch_tensors<AB: Backend>(
        &mut self,
        device: &AB::Device,
    ) -> (
        Tensor<AB, 2, Int>,
        Tensor<AB, 2, Int>,
        usize,
        Option<Documents>,
    ) {
        let (batch, seq) = (self.opts.batch, self.opts.seq_len);
        let (inputs, targets, documents) = self.batcher.next_batch_in(batch);
        let trained = trained_targets(&targets);
        let tensor = |v: Vec<i64>| Tensor::from_data(TensorData::new(v, [batch, seq]), device);
        (tensor(inputs), tensor(targets), trained, documents)
    }

    /// The run's progress display from step `start`.
    pub(super) fn progress(&self, start: usize) -> Progress {
        Progress::new(
            self.opts.progress,
            format!("{} params", human_count(self.config.num_params())),
            start,
            self.opts.steps,
        )
    }

    /// Writes `line` into the metrics file, if the run has one.
    pub(super) fn log(&mut self, line: &impl serde::Serialize) -> Result<(), JobError> {
        match self.metrics.as_mut() {
            Some(metrics) => Ok(metrics.line(line)?),
            None => Ok(()),
        }
    }
}
