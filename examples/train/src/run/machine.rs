//! What the machine has (host memory, GPUs and their free memory) and the
//! memory plan of a run on it.

use burn_offload::quant::BaseDtype;
use burn_offload::{Compute, FrozenDtype};
use models::ModelConfig;

use crate::options::*;
use crate::plan::{
    BlockInputs, DoesNotFit, HostLayout, Job as PlanJob, KeptGraphs, Machine, OptimState,
    ParamCache, Plan, GRADIENT_BLOCKS_IN_FLIGHT,
};
use crate::DefaultBackend;

/// Why the machine could not be read, or the job does not fit it.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// The CUDA driver's answer is part of the message rather than its
    /// source, so that error-chain printers do not repeat it.
    #[cfg(feature = "cuda")]
    #[error("cannot query GPU memory: {0}")]
    GpuMemory(burn_offload::cuda_backend::CudaError),
    #[cfg(feature = "cuda")]
    #[error("cannot count CUDA devices: {0}")]
    DeviceCount(burn_offload::cuda_backend::CudaError),
    #[error("--local-rank {gpu} needs GPU {gpu}, and the CUDA driver sees {count}")]
    LocalRankGpu { gpu: usize, count: usize },
    #[error("--gpus {asked} asks for more GPUs than the {count} the CUDA driver sees")]
    TooManyGpus { asked: usize, count: usize },
    /// The memory plan's refusal: what is short and what would fit.
    #[error(transparent)]
    DoesNotFit(#[from] DoesNotFit),
}

pub(crate) const GIB: f64 = (1u64 << 30) as f64;

/// Host memory the OS reports available (`MemAvailable`), in bytes.
pub(crate) fn available_host_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The machine the job runs on: host memory from `--host-mem-gib` or
/// MemAvailable (the GPU hosts grow RAM on demand, hence the flag), device
/// memory from `--gpu-mem-gib` or the CUDA driver.
pub fn machine(opts: &TrainOptions) -> Result<Machine, MachineError> {
    let (mut host_bytes, mut host_source) = match opts.host_mem_gib {
        Some(gib) => ((gib * GIB) as u64, "--host-mem-gib".to_string()),
        None => match available_host_bytes() {
            Some(bytes) => (bytes, "MemAvailable".to_string()),
            None => (u64::MAX, "unknown: not checked".to_string()),
        },
    };
    // The processes on a host each keep a store of their own in its memory.
    if let Some(place) = opts.processes.as_ref().filter(|p| p.local_world_size > 1) {
        if opts.host_mem_gib.is_none() && host_bytes != u64::MAX {
            host_bytes /= place.local_world_size as u64;
            host_source = format!(
                "MemAvailable / {} processes on this host",
                place.local_world_size
            );
        }
    }
    let (device_bytes, device_source) = match opts.gpu_mem_gib {
        Some(gib) => (Some((gib * GIB) as u64), "--gpu-mem-gib".to_string()),
        None => gpu_free_bytes(&lane_gpus(opts))?,
    };
    Ok(Machine {
        host_bytes,
        host_source,
        device_bytes,
        device_source,
    })
}

/// The GPUs this process's lanes run on: 0..`--gpus`, or in a run of
/// several processes, `--local-rank`'s.
pub(crate) fn lane_gpus(opts: &TrainOptions) -> Vec<usize> {
    match &opts.processes {
        Some(place) => vec![place.local_rank],
        None => (0..opts.gpus).collect(),
    }
}

/// Processes in the run (1 without `--world-size`).
pub(crate) fn world_size(opts: &TrainOptions) -> usize {
    opts.processes.as_ref().map_or(1, |p| p.world_size)
}

/// Whether this process writes the run's outputs: checkpoints, metrics,
/// the export and the sample (rank 0 of several).
pub(crate) fn writes_outputs(opts: &TrainOptions) -> bool {
    opts.processes.as_ref().is_none_or(|p| p.rank == 0)
}

/// The free memory of the most loaded of `gpus` (each runs the same lane
/// of the plan).
#[cfg(feature = "cuda")]
pub(crate) fn gpu_free_bytes(gpus: &[usize]) -> Result<(Option<u64>, String), MachineError> {
    check_gpus(gpus)?;
    let mut least = (u64::MAX, 0);
    for &index in gpus {
        let free = burn_offload::cuda_backend::free_device_bytes(index)
            .map_err(MachineError::GpuMemory)?;
        least = least.min((free, index));
    }
    let source = if gpus.len() == 1 {
        format!("free on GPU {} (CUDA driver)", least.1)
    } else {
        format!(
            "free on GPU {} of 0..{}, the least (CUDA driver)",
            least.1,
            gpus.len()
        )
    };
    Ok((Some(least.0), source))
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn gpu_free_bytes(_: &[usize]) -> Result<(Option<u64>, String), MachineError> {
    Ok((None, "CPU backend".into()))
}

/// Refuses GPUs beyond those the driver sees.
#[cfg(feature = "cuda")]
pub(crate) fn check_gpus(gpus: &[usize]) -> Result<(), MachineError> {
    let count = burn_offload::cuda_backend::device_count().map_err(MachineError::DeviceCount)?;
    match gpus {
        [gpu] if *gpu >= count => Err(MachineError::LocalRankGpu { gpu: *gpu, count }),
        _ if gpus.len() > count => Err(MachineError::TooManyGpus {
            asked: gpus.len(),
            count,
        }),
        _ => Ok(()),
    }
}

/// The devices the engine trains on: [`lane_gpus`] on CUDA.
#[cfg(feature = "cuda")]
pub(crate) fn lane_devices(opts: &TrainOptions) -> Result<Vec<DefaultDevice>, MachineError> {
    let gpus = lane_gpus(opts);
    check_gpus(&gpus)?;
    Ok(gpus
        .into_iter()
        .map(burn::backend::cuda::CudaDevice::new)
        .collect())
}

/// The devices the engine trains on: on CPU backends, `--gpus` logical
/// devices (the one device, a lane each: the data-parallel schedule without
/// GPUs), or one for each process of several.
#[cfg(not(feature = "cuda"))]
pub(crate) fn lane_devices(opts: &TrainOptions) -> Result<Vec<DefaultDevice>, MachineError> {
    Ok(vec![Default::default(); lane_gpus(opts).len()])
}

type DefaultDevice = burn::tensor::Device<DefaultBackend>;

/// Bytes reserved by the GPU allocator's pools on the first GPU the run
/// trains on (CUDA builds).
pub(crate) fn gpu_reserved_bytes(opts: &TrainOptions) -> Option<u64> {
    #[cfg(feature = "cuda")]
    return Some(
        burn_offload::cuda_backend::pool_bytes(&burn::backend::cuda::CudaDevice::new(
            lane_gpus(opts)[0],
        ))
        .1,
    );
    #[cfg(not(feature = "cuda"))]
    {
        let _ = opts;
        None
    }
}

/// Whether cuDNN's fused attention will run this job's attention where it
/// takes the heads: a CUDA build, `--attention auto` and libcudnn 9 found.
fn cudnn_runs(opts: &TrainOptions) -> bool {
    #[cfg(feature = "cuda")]
    return opts.attention == AttentionKernels::Auto
        && burn_offload::ops::attention::cudnn_version().is_some();
    #[cfg(not(feature = "cuda"))]
    {
        let _ = opts;
        false
    }
}

/// The memory plan of this job on `machine` (nothing is allocated).
pub fn plan(opts: &TrainOptions, config: ModelConfig, machine: &Machine) -> (Plan, PlanJob) {
    let job = unplaced_job(opts, config).placed(machine);
    (Plan::new(&job), job)
}

/// The job `opts` describe for `config`, its knobs not yet placed on a
/// machine.
fn unplaced_job(opts: &TrainOptions, config: ModelConfig) -> PlanJob {
    // A bad LoRA option was refused before any plan (`preflight`).
    let lora = super::lora::lora_config(opts, &config).ok().flatten();
    let trained_params = lora
        .as_ref()
        .map(|lora| super::lora::trained_params(&config, lora));
    // Counted for a resident job too: the plan may suggest streaming it.
    let base_dtype = super::lora::base_dtype(opts);
    let frozen_host_bytes = lora
        .as_ref()
        .map(|lora| super::lora::frozen_host_bytes(&config, lora, base_dtype));
    // The smaller formats the plan may suggest when the base does not fit.
    let smaller_bases = match (&lora, frozen_host_bytes) {
        (Some(lora), Some(bytes)) => BaseDtype::ALL
            .into_iter()
            .map(|base| {
                let dtype = FrozenDtype::Base(base);
                (dtype, super::lora::frozen_host_bytes(&config, lora, dtype))
            })
            .filter(|&(_, smaller)| smaller < bytes)
            .map(|(dtype, bytes)| (dtype.name(), bytes))
            .collect(),
        _ => Vec::new(),
    };
    PlanJob {
        config,
        batch: opts.batch,
        seq_len: opts.seq_len,
        accum: opts.accum,
        gpus: opts.gpus,
        fused: opts.fused,
        resident: opts.resident,
        host_params: opts.host_params,
        compute: opts.compute,
        loss_chunk_tokens: opts.loss_chunk_tokens,
        gpu: cfg!(feature = "cuda"),
        cudnn: cudnn_runs(opts),
        block_inputs: opts.block_inputs,
        device_block_inputs: 0,
        kept_graphs: opts.kept_graphs,
        kept_attention: 0,
        host_layout: opts.host_layout,
        optim_state: opts.optim_state,
        gradient_blocks_in_flight: GRADIENT_BLOCKS_IN_FLIGHT,
        mlp_tile: None,
        block_recompute: opts.block_recompute,
        param_cache: match opts.param_cache_gib {
            Some(gib) => ParamCache::Bytes((gib * GIB) as u64),
            None => ParamCache::Auto,
        },
        trained_params,
        frozen_host_bytes,
        smaller_bases,
        frozen_stem: lora.is_some() && !opts.lora.train_embeddings,
        gpu_budget: opts.gpu_mem_gib.is_some(),
    }
}

/// The longest sequence, in whole thousands (1024) of tokens, whose plan
/// fits `machine` at batch 1 with the job's other settings (the same
/// choices made for it); `None` when not even 1024 tokens fit.
pub fn longest_sequence(job: &PlanJob, machine: &Machine) -> Option<usize> {
    let fits = |k: usize| {
        let candidate = PlanJob {
            batch: 1,
            seq_len: k * 1024,
            block_inputs: BlockInputs::Auto,
            kept_graphs: KeptGraphs::Auto,
            mlp_tile: None,
            ..job.clone()
        };
        let candidate = candidate.placed(machine);
        Plan::new(&candidate).check_quiet(machine)
    };
    if !fits(1) {
        return None;
    }
    // Memory grows with the sequence: the last that fits, by bisection
    // below the first of the doublings that does not (up to 16M tokens).
    let (mut lo, mut hi) = (1, 2);
    while hi <= 1 << 14 && fits(hi) {
        (lo, hi) = (hi, 2 * hi);
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo * 1024)
}

/// The presets of real models (not the `*-tiny` test ones), the most
/// parameters first: the order in which the planner looks for the largest
/// that fits.
fn presets_largest_first() -> Vec<(&'static str, ModelConfig)> {
    let mut presets: Vec<(&'static str, ModelConfig)> = models::PRESETS
        .iter()
        .filter(|name| !name.ends_with("tiny"))
        .map(|&name| (name, ModelConfig::preset(name).expect("a preset")))
        .collect();
    presets.sort_by_key(|(_, config)| std::cmp::Reverse(config.num_params()));
    presets
}

/// For a LoRA job: under each base format, the largest Llama-family preset
/// whose plan fits `machine` with the job's other settings (batch, sequence,
/// targets, GPU budget), with the base's host bytes per parameter; `None`
/// where not even the smallest fits. Empty without LoRA, or where the
/// targets name no Llama projection.
pub fn largest_lora_bases(
    opts: &TrainOptions,
    machine: &Machine,
) -> Vec<(FrozenDtype, Option<(&'static str, f64)>)> {
    let presets: Vec<(&'static str, ModelConfig)> = presets_largest_first()
        .into_iter()
        .filter(|(_, config)| matches!(config, ModelConfig::Llama(_)))
        .filter(|(_, config)| matches!(super::lora::lora_config(opts, config), Ok(Some(_))))
        .collect();
    if presets.is_empty() {
        return Vec::new();
    }
    let mut dtypes = vec![FrozenDtype::F32];
    dtypes.extend(BaseDtype::ALL.map(FrozenDtype::Base));
    dtypes
        .into_iter()
        .filter(|&dtype| dtype != FrozenDtype::F32 || opts.compute == burn_offload::Compute::Fp32)
        .map(|dtype| {
            let mut with = opts.clone();
            with.lora.base_dtype = Some(dtype);
            with.resident = false;
            let largest = presets.iter().find_map(|(name, config)| {
                let (plan, job) = plan(&with, config.clone(), machine);
                plan.check_quiet(machine).then(|| {
                    let bytes = job.frozen_host_bytes.expect("a LoRA job") as f64;
                    (*name, bytes / config.num_params() as f64)
                })
            });
            (dtype, largest)
        })
        .collect()
}

/// A full fine-tune's store mode, as `--plan` and the README's table of big
/// models compare them: the flags a user passes, and what they set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreMode {
    /// The flags, as given to `train`.
    pub flags: &'static str,
    compute: Compute,
    fused: bool,
    optim_state: OptimState,
}

impl StoreMode {
    const fn new(flags: &'static str, compute: Compute, fused: bool, eight_bit: bool) -> Self {
        let optim_state = if eight_bit {
            OptimState::EightBit
        } else {
            OptimState::Fp32
        };
        Self {
            flags,
            compute,
            fused,
            optim_state,
        }
    }

    /// `opts` in this mode: the engine, the host layout left to the plan
    /// (compact where the full one does not fit), one micro-batch when
    /// fused (which applies each gradient as it arrives).
    fn apply(&self, opts: &TrainOptions) -> TrainOptions {
        let mut with = opts.clone();
        with.compute = self.compute;
        with.fused = self.fused;
        with.optim_state = self.optim_state;
        with.host_layout = HostLayout::Auto;
        with.resident = false;
        with.host_params = false;
        if self.fused {
            with.accum = 1;
        }
        with
    }
}

/// The store modes of a full fine-tune, from the most host bytes a
/// parameter to the fewest (16, 14, 12, 8 and 6 where the compact layout
/// applies).
pub const STORE_MODES: [StoreMode; 5] = [
    StoreMode::new("--compute fp32", Compute::Fp32, false, false),
    StoreMode::new("--compute bf16", Compute::Bf16, false, false),
    StoreMode::new("--compute bf16 --fused", Compute::Bf16, true, false),
    StoreMode::new(
        "--compute bf16 --optim-state 8bit",
        Compute::Bf16,
        false,
        true,
    ),
    StoreMode::new(
        "--compute bf16 --fused --optim-state 8bit",
        Compute::Bf16,
        true,
        true,
    ),
];

/// The largest preset trained in full whose plan fits `machine`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LargestPreset {
    /// The preset's name (`--model`).
    pub name: &'static str,
    /// Its parameters.
    pub params: u64,
    /// The store's host bytes a parameter, as the plan placed it.
    pub bytes_per_param: u64,
}

/// For each [`STORE_MODES`] entry, the largest preset (by parameters) whose
/// full fine-tune fits `machine` with `opts`' other settings (batch,
/// sequence, GPU budget); `None` where not even the smallest fits. `gpu`
/// says whether the device is a GPU (a CPU build's own plan counts none).
pub fn largest_presets(
    opts: &TrainOptions,
    machine: &Machine,
    gpu: bool,
) -> Vec<(StoreMode, Option<LargestPreset>)> {
    let presets = presets_largest_first();
    STORE_MODES
        .iter()
        .map(|mode| {
            let with = mode.apply(opts);
            let largest = presets.iter().find_map(|(name, config)| {
                let mut job = unplaced_job(&with, config.clone());
                job.gpu = gpu;
                job.cudnn &= gpu;
                let job = job.placed(machine);
                Plan::new(&job).check_quiet(machine).then(|| LargestPreset {
                    name,
                    params: config.num_params() as u64,
                    bytes_per_param: job.store_bytes_per_param(),
                })
            });
            (*mode, largest)
        })
        .collect()
}

/// The README's table of big models: for hosts of 64 GiB to 1 TiB beside
/// an 80 GiB GPU (an H100), the largest preset each store mode fine-tunes
/// in full, one 4,096-token sequence a step, as the planner counts it.
pub fn big_models_table() -> String {
    // Attention's scratch counted as the CubeCL kernels' (more than
    // cuDNN's), so that the table is the same whether cuDNN is found or not.
    let opts = TrainOptions {
        batch: 1,
        seq_len: 4096,
        attention: AttentionKernels::Cubecl,
        ..TrainOptions::default()
    };
    let mut table = String::from("| host RAM |");
    for mode in STORE_MODES {
        table.push_str(&format!(" `{}` |", mode.flags));
    }
    table.push_str("\n|---|");
    table.push_str(&"---|".repeat(STORE_MODES.len()));
    table.push('\n');
    for gib in [64u64, 128, 256, 512, 1024] {
        let machine = Machine {
            host_bytes: gib << 30,
            host_source: "the table's host".into(),
            device_bytes: Some(80 << 30),
            device_source: "the table's GPU".into(),
        };
        let host = if gib < 1024 {
            format!("{gib} GiB")
        } else {
            "1 TiB".into()
        };
        table.push_str(&format!("| {host} |"));
        for (_, largest) in largest_presets(&opts, &machine, true) {
            match largest {
                Some(p) => table.push_str(&format!(
                    " {} ({:.1}B, {} B/param) |",
                    p.name,
                    p.params as f64 / 1e9,
                    p.bytes_per_param
                )),
                None => table.push_str(" — |"),
            }
        }
        table.push('\n');
    }
    table
}

/// Refuses, before anything is allocated, a job that does not fit the
/// machine; otherwise the job with its block inputs placed and its kept
/// graphs counted.
pub(crate) fn check_memory(
    opts: &TrainOptions,
    config: &ModelConfig,
) -> Result<PlanJob, MachineError> {
    let machine = machine(opts)?;
    let (plan, job) = plan(opts, config.clone(), &machine);
    plan.check(&job, &machine)?;
    Ok(job)
}
