//! What the planner's tests share: a job, the models and the machines.

#![allow(dead_code)]

use burn_offload::Compute;
use models::{LlamaConfig, ModelConfig};
use trainer::plan::{BlockInputs, HostLayout, Job, KeptGraphs, Machine, OptimState};

pub fn job(config: ModelConfig, fused: bool) -> Job {
    Job {
        config,
        batch: 2,
        seq_len: 16,
        accum: 1,
        gpus: 1,
        fused,
        resident: false,
        host_params: false,
        compute: Compute::Fp32,
        loss_chunk_tokens: 4096,
        gpu: false,
        cudnn: false,
        // The H100 figures below were measured with block inputs in host memory.
        block_inputs: BlockInputs::Host,
        device_block_inputs: 0,
        kept_graphs: KeptGraphs::Count(0),
        kept_attention: 0,
        host_layout: HostLayout::Full,
        optim_state: OptimState::Fp32,
        gradient_blocks_in_flight: trainer::plan::GRADIENT_BLOCKS_IN_FLIGHT,
        mlp_tile: None,
        param_cache: trainer::plan::ParamCache::Auto,
        block_recompute: trainer::plan::Recompute::Auto,
        trained_params: None,
        frozen_host_bytes: None,
        smaller_bases: Vec::new(),
        frozen_stem: false,
        gpu_budget: false,
    }
}

pub fn medium_llama() -> LlamaConfig {
    LlamaConfig {
        d_model: 256,
        n_layer: 6,
        n_head: 8,
        n_kv_head: 2,
        d_ff: 704,
        vocab_size: 512,
        ..LlamaConfig::tiny()
    }
}

pub fn machine(host: u64, device: Option<u64>) -> Machine {
    Machine {
        host_bytes: host,
        host_source: "test".into(),
        device_bytes: device,
        device_source: "test".into(),
    }
}

/// The GPU peaks measured on the H100 (whole process, nvidia-smi; 78.66 GiB
/// free) with attention as one operation (`burn_offload::ops::attention`): the
/// 0.85B rows with every block recomputed at 4k and 16k tokens
/// (bench/results/cuda-bench), each within 10% of the
/// prediction. The head phase and the block backward do not add up, and
/// small jobs sit on cubecl's page floor. (A 7.39B run in bench/results/cuda-bench measured
/// 11373 MiB with the earlier attention, which kept the `[b, h, t, t]`
/// weights for the backward; it has not been run again.)
/// The lent H100 as the runs measured it: 125 GiB of host memory, 78.66 GiB
/// free on the GPU.
pub fn h100() -> Machine {
    Machine {
        host_bytes: 125 << 30,
        host_source: "test".into(),
        device_bytes: Some((78.66 * (1u64 << 30) as f64) as u64),
        device_source: "test".into(),
    }
}

/// The 0.85B Llama of the bench rows.
pub fn llama_085b() -> ModelConfig {
    ModelConfig::Llama(LlamaConfig {
        vocab_size: 32000,
        d_model: 2048,
        n_layer: 16,
        n_head: 32,
        n_kv_head: 8,
        d_ff: 5632,
        max_seq_len: 2048,
        ..LlamaConfig::tiny()
    })
}
