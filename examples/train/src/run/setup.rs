//! A run from its options: the checks, the model and its data, the resume,
//! the memory plan, and the loop it hands them to.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::{ModuleVisitor, Param};
use burn::prelude::*;
use burn_offload::{Compute, HostOptimizerConfig, MatmulError, PrecisionError};
use models::hf::{CheckpointValues, HfError};
use models::{ConfigError, ModelConfig};

use super::data::{DataReadError, RunData};
use super::job::*;
use super::lora;
use super::machine::*;
use super::resume::*;
use super::state::*;
use crate::export::{self, ExportError};
use crate::instruct::{self, DataFormat};
use crate::options::*;
use crate::outputs::{MetricsFile, OutputError};
use crate::processes::RankError;
use crate::signals;
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::DefaultBackend;

/// Why a run failed: every concern's error as it said it. Those before the
/// first step leave nothing behind.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Options(#[from] OptionsError),
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    ModelConfig(#[from] ConfigError),
    /// `--init-from`'s config or weights.
    #[error(transparent)]
    Checkpoint(#[from] HfError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Resume(#[from] ResumeError),
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The other ranks could not be met.
    #[error(transparent)]
    Processes(#[from] RankError),
    #[error(transparent)]
    Job(#[from] JobError),
}

/// The settings of a run, read together, that cannot make a run; each
/// names what is wrong. (A wrapped error is part of the message rather
/// than its source, so that error-chain printers do not repeat it.)
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// `--lora-targets` naming no projection of the model (or none known).
    #[error("--lora-targets: {0}")]
    Lora(models::lora::LoraError),
    #[error(
        "--model `{0}` is a folder; --model takes a preset name or a config .json file (a \
         Hugging Face checkpoint folder goes to --init-from)"
    )]
    ModelIsAFolder(String),
    #[error(
        "model vocab_size {model} is smaller than the {tokenizer} tokenizer's vocabulary \
         ({vocab})"
    )]
    Vocabulary {
        model: usize,
        tokenizer: String,
        vocab: usize,
    },
    #[error("--seq-len {seq_len} exceeds the model's context length {max_seq_len}")]
    SeqLen { seq_len: usize, max_seq_len: usize },
    #[error("--train-on-prompt and --no-packing apply to instruction data, and --data is text")]
    ShapingText,
    #[error("--data-cache holds tokenized text corpora; --data is not a text corpus")]
    DataCacheNotText,
    /// `--data` or `--eval-data`, read.
    #[error(transparent)]
    Data(#[from] DataReadError),
    #[error("--matmul: {0}")]
    Matmul(MatmulError),
    #[error("--compute {compute}: {why}")]
    Compute {
        compute: Compute,
        why: PrecisionError,
    },
}

/// Model config after applying the tokenizer: presets take the tokenizer's
/// vocabulary; a JSON config must already be large enough for it.
pub(crate) fn resolve_config(
    opts: &TrainOptions,
    tokenizer: &Tokenizer,
) -> Result<ModelConfig, TrainError> {
    let from_hf = opts.init_from.is_some();
    let mut config = match &opts.init_from {
        Some(dir) => models::hf::load_config(dir)?,
        None if Path::new(&opts.model).is_dir() => {
            return Err(SetupError::ModelIsAFolder(opts.model.clone()).into())
        }
        None => ModelConfig::from_arg(&opts.model)?,
    };
    let vocab = tokenizer.vocab_size();
    if !from_hf && models::PRESETS.contains(&opts.model.as_str()) {
        config.set_vocab_size(vocab);
    } else if config.vocab_size() < vocab {
        return Err(SetupError::Vocabulary {
            model: config.vocab_size(),
            tokenizer: tokenizer.name().to_string(),
            vocab,
        }
        .into());
    }
    if opts.seq_len > config.max_seq_len() {
        return Err(SetupError::SeqLen {
            seq_len: opts.seq_len,
            max_seq_len: config.max_seq_len(),
        }
        .into());
    }
    Ok(config)
}

/// What a run reads, each part checked against the others; nothing is
/// allocated or written to find it out.
pub struct Checked {
    pub tokenizer: Tokenizer,
    pub config: ModelConfig,
    /// What `--data` holds.
    pub format: DataFormat,
    /// What `--eval-data` holds, when given.
    pub eval_format: Option<DataFormat>,
}

/// The options, the tokenizer and the model config, checked.
pub(crate) fn checked_model(opts: &TrainOptions) -> Result<(Tokenizer, ModelConfig), TrainError> {
    validate(opts)?;
    let tokenizer = Tokenizer::for_run(opts.tokenizer.as_deref(), opts.init_from.as_deref())?;
    let config = resolve_config(opts, &tokenizer)?;
    Ok((tokenizer, config))
}

/// Everything about a run that can be checked before anything is built:
/// the options, the tokenizer, the model config, what `--data` holds and
/// where the export goes. The launcher of several processes runs it before
/// starting any, and every run before its memory plan.
pub fn preflight(opts: &TrainOptions) -> Result<Checked, TrainError> {
    let (tokenizer, config) = checked_model(opts)?;
    let format = match (&opts.data, opts.data_format) {
        (Some(path), DataFormat::Auto) => {
            instruct::detect(path).map_err(|e| SetupError::from(DataReadError::Instructions(e)))?
        }
        (None, DataFormat::Auto) => DataFormat::Text,
        (_, format) => format,
    };
    // Read as --data is: the format given, or each its own detected.
    let eval_format = match (&opts.eval_data, opts.data_format) {
        (Some(path), DataFormat::Auto) => Some(
            instruct::detect(path)
                .map_err(|e| SetupError::from(DataReadError::EvalInstructions(e)))?,
        ),
        (Some(_), format) => Some(format),
        (None, _) => None,
    };
    if let Some(path) = &opts.data {
        instruct::check_parquet(path, format)
            .map_err(|e| SetupError::from(DataReadError::Instructions(e)))?;
    }
    if let (Some(path), Some(format)) = (&opts.eval_data, eval_format) {
        instruct::check_parquet(path, format)
            .map_err(|e| SetupError::from(DataReadError::EvalInstructions(e)))?;
    }
    if format == DataFormat::Text && (opts.train_on_prompt || !opts.packing) {
        return Err(SetupError::ShapingText.into());
    }
    if opts.data_cache.is_some() && (format != DataFormat::Text || opts.data.is_none()) {
        return Err(SetupError::DataCacheNotText.into());
    }
    if let Some(dir) = opts.export_hf.as_ref().filter(|_| writes_outputs(opts)) {
        export::check(export::HF, dir, opts.overwrite, &export::run_folders(opts))?;
    }
    lora::lora_config(opts, &config).map_err(SetupError::Lora)?;
    if writes_outputs(opts) {
        lora::check_export(opts)?;
    }
    Ok(Checked {
        tokenizer,
        config,
        format,
        eval_format,
    })
}

/// Runs a training job on the default backend.
pub fn run(opts: &TrainOptions) -> Result<TrainReport, TrainError> {
    let Checked {
        tokenizer,
        config,
        format,
        eval_format,
    } = preflight(opts)?;
    // Before the first CUDA tensor: pages of the pools sized to the budget.
    #[cfg(feature = "cuda")]
    if let Some(gib) = opts.gpu_mem_gib {
        let largest = 4 * crate::plan::shape(&config).largest_tensor;
        burn_offload::cuda_backend::limit_memory_pages((gib * GIB) as u64, largest);
    }
    if opts.progress {
        if let (None, Some(dir), Tokenizer::Byte) = (&opts.tokenizer, &opts.init_from, &tokenizer) {
            eprintln!(
                "warning: --init-from `{}` has no tokenizer.json: tokenizing as bytes (256 ids); \
                 give --tokenizer the model's tokenizer.json",
                dir.display()
            );
        }
    }
    let placed = check_memory(opts, &config)?;
    if opts.progress && !opts.resident {
        let mlp = match placed.mlp_tile {
            Some(tile) => format!("; MLP over tiles of {tile} tokens"),
            None => String::new(),
        };
        eprintln!("memory plan: {}{mlp}", placed.store_mode());
    }
    if opts.host_params {
        let bytes = placed.param_cache.bytes();
        burn_offload::residency::set_param_cache_bytes(bytes);
        let recompute = placed.recomputes_blocks();
        burn_offload::set_offload_recompute(recompute);
        if opts.progress {
            eprintln!(
                "parameter cache: {:.2} GiB of device copies; blocks {}",
                bytes as f64 / GIB,
                if recompute {
                    "run as checkpoints (recomputed in the backward)"
                } else {
                    "in one graph on the GPU"
                }
            );
        }
    }
    let RunData {
        batcher,
        corpus,
        sample_prompt,
        eval,
    } = super::data::read(opts, format, eval_format, &tokenizer).map_err(SetupError::from)?;
    let adapters = lora::lora_config(opts, &config).map_err(SetupError::Lora)?;
    let adapter_run = lora::adapter_run(opts, adapters.as_ref())?;
    let resume = match &opts.resume {
        Some(path) => Some(Resume::read(
            path,
            opts,
            &config,
            &tokenizer,
            corpus,
            adapter_run.as_ref(),
        )?),
        None => None,
    };

    type B = DefaultBackend;
    type AB = Autodiff<DefaultBackend>;
    burn_offload::set_matmul(&opts.matmul).map_err(SetupError::Matmul)?;
    #[cfg(feature = "cuda")]
    burn_offload::ops::attention::set_cudnn_attention(opts.attention == AttentionKernels::Auto);
    // The engine's devices (`--gpus`, or this rank's GPU), checked before
    // the model is built; the model is drawn on the first.
    let devices = lane_devices(opts)?;
    let device = devices.first().cloned().expect("one device at least");
    opts.compute
        .check::<B>(&device)
        .map_err(|why| SetupError::Compute {
            compute: opts.compute,
            why,
        })?;
    if let Some(dir) = &opts.init_from {
        // Every tensor present with its shape, before anything is written
        // (the weights are read when the model is built).
        match &config {
            ModelConfig::Llama(c) => {
                models::hf::check_weights(&c.init::<B>(&device), &config, dir)?
            }
            ModelConfig::Gpt2(c) => models::hf::check_weights(&c.init::<B>(&device), &config, dir)?,
        }
    }
    if let Some(resume) = resume
        .as_ref()
        .filter(|r| r.state.steps_done == opts.steps && opts.export_hf.is_none())
    {
        // Nothing to train, export or sample: the run is complete.
        return Ok(TrainReport {
            config,
            losses: Vec::new(),
            sample: String::new(),
            start_step: resume.state.steps_done,
            resumed_from: Some(resume.path.clone()),
            interrupted: None,
            checkpoint: None,
            exported: None,
            adapters: None,
            skipped_total: resume.state.skipped_total,
            evaluations: Vec::new(),
            best_eval: resume.state.best_eval,
        });
    }

    // Every output is checked (the export folder in `preflight`, the
    // checkpoint folder locked here) before the model is built: a bad path
    // costs no training. Of several processes, rank 0 writes them.
    let outputs = writes_outputs(opts);
    let run_id = match &resume {
        Some(resume) => resume.run.clone(),
        None => format!("{:016x}", rand::random::<u64>()),
    };
    let checkpoints = match opts.checkpoint_dir.as_ref().filter(|_| outputs) {
        Some(dir) => {
            let checkpoints = crate::outputs::checkpoint_dir(dir, &run_id, opts.keep)?;
            // The resolved options beside the checkpoints, for `--resume`.
            if let Some(text) = &opts.resolved_config {
                crate::config::write(dir, text).map_err(OutputError::from)?;
            }
            Some(checkpoints)
        }
        None => None,
    };
    let metrics = match opts.metrics.as_ref().filter(|_| outputs) {
        Some(path) => Some(MetricsFile::open(path, resume.is_some())?),
        None => None,
    };
    // The other ranks, met once each has checked its own inputs.
    let group = match &opts.processes {
        Some(place) => Some(place.join()?),
        None => None,
    };
    signals::update(|progress| {
        *progress = signals::Progress {
            steps_done: resume.as_ref().map_or(0, |r| r.state.steps_done),
            saved: resume
                .as_ref()
                .map(|r| (r.path.clone(), r.state.steps_done)),
            checkpointing: checkpoints.is_some(),
        }
    });

    let resumed_from = resume.as_ref().map(|r| r.path.clone());
    let job = Job {
        opts,
        tokenizer: &tokenizer,
        batcher,
        metrics,
        checkpoints,
        resume,
        config: config.clone(),
        corpus,
        device_checkpoints: placed.device_checkpoints(),
        kept_graphs: placed.kept_graphs.count(),
        kept_attention: placed.kept_attention,
        gradient_blocks_in_flight: placed.gradient_blocks_in_flight,
        cast_on_device: placed.compact(),
        compute_precision_gradients: placed.compact_gradients(),
        building: Instant::now(),
        group,
        sample_prompt,
        eval,
        best: None,
        lora: adapters.clone(),
        adapter_run,
    };
    // `--host-params`: the same loop over `Offload<B>` with the host AdamW.
    type HostAb = Autodiff<burn_offload::Offload<DefaultBackend>>;
    let burn_adamw = opts.burn_adamw();
    let host_adamw =
        HostOptimizerConfig::adamw(opts.adamw()).with_grad_clipping(opts.grad_clipping());
    let outcome = match (&config, opts.resident, opts.host_params) {
        (ModelConfig::Gpt2(c), true, false) => job.train_resident::<AB, _, _>(
            lora::adapt(
                initial(opts, &config, &device, true, || c.init::<AB>(&device))?.0,
                adapters.as_ref(),
                &device,
            )
            .map_err(SetupError::Lora)?,
            burn_adamw.init(),
            &device,
        )?,
        (ModelConfig::Llama(c), true, false) => job.train_resident::<AB, _, _>(
            lora::adapt(
                initial(opts, &config, &device, true, || c.init::<AB>(&device))?.0,
                adapters.as_ref(),
                &device,
            )
            .map_err(SetupError::Lora)?,
            burn_adamw.init(),
            &device,
        )?,
        (ModelConfig::Gpt2(c), true, true) => job.train_resident::<HostAb, _, _>(
            lora::adapt(
                initial(opts, &config, &device, true, || c.init::<HostAb>(&device))?.0,
                adapters.as_ref(),
                &device,
            )
            .map_err(SetupError::Lora)?,
            host_adamw.init(),
            &device,
        )?,
        (ModelConfig::Llama(c), true, true) => job.train_resident::<HostAb, _, _>(
            lora::adapt(
                initial(opts, &config, &device, true, || c.init::<HostAb>(&device))?.0,
                adapters.as_ref(),
                &device,
            )
            .map_err(SetupError::Lora)?,
            host_adamw.init(),
            &device,
        )?,
        (ModelConfig::Gpt2(c), false, _) => {
            let (model, rng, values) =
                initial(opts, &config, &device, false, || c.init::<B>(&device))?;
            let model = lora::adapt(model, adapters.as_ref(), &device).map_err(SetupError::Lora)?;
            job.train_engine::<B, _>((model, rng, values), &devices)?
        }
        (ModelConfig::Llama(c), false, _) => {
            let (model, rng, values) =
                initial(opts, &config, &device, false, || c.init::<B>(&device))?;
            let model = lora::adapt(
                model.with_mlp_tiles(placed.mlp_tile),
                adapters.as_ref(),
                &device,
            )
            .map_err(SetupError::Lora)?;
            job.train_engine::<B, _>((model, rng, values), &devices)?
        }
    };
    if opts.progress && opts.host_params {
        let (paged, prefetch, updates) = (
            burn_offload::residency::stats(),
            burn_offload::prefetch::stats(),
            burn_offload::host_update_stats(),
        );
        let steps = prefetch.steps.max(1) as f64;
        eprintln!(
            "offload: {:.2} GB paged in ({:.2} GB cache peak of {:.2}); prefetch: {} copies ({:.2} GB), \
             trace followed by {} of {} steps; host updates {:.3} s a step, {:.3} s waiting for gradients",
            paged.bytes_to_device as f64 / 1e9,
            paged.peak_resident_bytes as f64 / 1e9,
            paged.budget_bytes as f64 / 1e9,
            prefetch.copies,
            prefetch.bytes as f64 / 1e9,
            prefetch.replayed,
            prefetch.steps,
            updates.updating.as_secs_f64() / steps,
            updates.waiting.as_secs_f64() / steps,
        );
    }
    #[cfg(feature = "cuda")]
    if opts.progress && opts.matmul != "auto" {
        // How much of the work the chosen kernel took, and what it left to
        // burn's matmul: a kernel that declines the common cases buys nothing.
        let stats = burn_offload::cuda_backend::matmul_stats();
        eprintln!(
            "matmul {}: ran {} matmuls ({:.2} s in its calls), left {} to burn's matmul",
            opts.matmul, stats.launched, stats.call_s, stats.fell_back
        );
        for case in &stats.declined {
            eprintln!("  declined: {case}");
        }
    }
    Ok(TrainReport {
        config,
        losses: outcome.losses,
        sample: outcome.sample,
        start_step: outcome.start_step,
        resumed_from,
        interrupted: outcome.interrupted,
        checkpoint: outcome.checkpoint,
        exported: outcome.exported,
        adapters: outcome.adapters,
        skipped_total: outcome.skipped_total,
        evaluations: outcome.evaluations,
        best_eval: outcome.best_eval,
    })
}

/// burn's CPU backends draw random tensors from one process-wide RNG, and a
/// module's parameters are drawn lazily, on first use. Seeding and drawing
/// every initial weight happen under this lock, so two jobs in one process
/// (the test suite, a sweep) cannot interleave their draws: a run's weights
/// depend on its seed alone.
pub(crate) static WEIGHT_RNG: Mutex<()> = Mutex::new(());

/// The starting model: drawn from `--seed`, or with `--init-from`'s weights
/// (burn's lazy parameters are replaced before any random init runs).
///
/// With `draw`, every weight is drawn here. Without, the weights stay lazy
/// and the caller draws them while it holds the returned lock: the engine
/// draws one tensor at a time straight into its host store, so a model larger
/// than the device never exists on it whole, and takes a checkpoint's
/// tensors (the returned values) from the files without a device.
pub(crate) fn initial<X: Backend, M: burn::module::Module<X>>(
    opts: &TrainOptions,
    config: &ModelConfig,
    device: &X::Device,
    draw: bool,
    init: impl FnOnce() -> M,
) -> Result<(M, MutexGuard<'static, ()>, Option<CheckpointValues>), HfError> {
    let rng = WEIGHT_RNG.lock().unwrap_or_else(PoisonError::into_inner);
    X::seed(device, opts.seed);
    let model = init();
    let (model, values) = match &opts.init_from {
        Some(dir) => {
            let (model, values) = models::hf::load_weights_for_store(model, config, dir)?;
            (model, Some(values))
        }
        None => (model, None),
    };
    if draw {
        model.visit(&mut DrawWeights);
    }
    Ok((model, rng, values))
}

/// Forces every lazily initialised parameter to be drawn now.
pub(crate) struct DrawWeights;

impl<X: Backend> ModuleVisitor<X> for DrawWeights {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<X, D>>) {
        let _ = param.val();
    }
}

/// `train --plan`: the table of predicted memory against the machine, and
/// the longest sequence these settings fit.
pub fn plan_table(opts: &TrainOptions) -> Result<String, TrainError> {
    let (_, config) = checked_model(opts)?;
    let machine = machine(opts)?;
    let (plan, job) = plan(opts, config, &machine);
    let mut table = plan.table(&machine);
    match plan.check(&job, &machine) {
        Ok(()) => table.push_str("fits\n"),
        Err(why) => table.push_str(&format!("does not fit: {why}\n")),
    }
    if let Some(tile) = job.mlp_tile {
        table.push_str(&format!("MLP over tiles of {tile} tokens\n"));
    }
    if let Some(links) = crate::links::Links::of(&job) {
        table.push_str(&links.describe());
    }
    match longest_sequence(&job, &machine) {
        Some(tokens) => table.push_str(&format!(
            "longest sequence that fits at batch 1: {tokens} tokens (the model's max_seq_len: {})\n",
            job.config.max_seq_len()
        )),
        None => table.push_str("no sequence of 1024 tokens fits at batch 1\n"),
    }
    if !opts.lora.enabled() {
        table.push_str(
            "largest preset trained in full on this machine with these settings, by store mode:\n",
        );
        for (mode, largest) in largest_presets(opts, &machine, job.gpu) {
            let largest = match largest {
                Some(p) => format!(
                    "{} ({:.2}B parameters, {} B/param in the store)",
                    p.name,
                    p.params as f64 / 1e9,
                    p.bytes_per_param
                ),
                None => "none".into(),
            };
            table.push_str(&format!("  {:<42} {largest}\n", mode.flags));
        }
    }
    let bases = largest_lora_bases(opts, &machine);
    if !bases.is_empty() {
        table.push_str("largest preset whose LoRA base fits these settings, by --base-dtype:\n");
    }
    for (dtype, largest) in bases {
        match largest {
            Some((name, bytes)) => table.push_str(&format!(
                "  {:<5} {name} ({bytes:.2} host B/param for the base)\n",
                dtype.name()
            )),
            None => table.push_str(&format!("  {:<5} none\n", dtype.name())),
        }
    }
    Ok(table)
}
