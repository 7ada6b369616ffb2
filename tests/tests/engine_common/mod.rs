//! What the engine's tests share: the engine's settings and the count of
//! parameters its store holds.

#![allow(dead_code)]

use burn_offload::{AdamWConfig, Compute, EngineConfig, OptimizerConfig};

/// Parameters (slots) the engine's store holds, over all groups.
pub fn slot_count(store: &burn_offload::HostStore) -> usize {
    store.groups.iter().map(|g| g.slots.len()).sum()
}

pub fn engine_config(fused: bool) -> EngineConfig {
    EngineConfig {
        optimizer: OptimizerConfig::AdamW(AdamWConfig {
            weight_decay: 0.01,
            ..Default::default()
        }),
        grad_clip: None,
        fused,
        // Small chunks so the chunked head really splits the sequence.
        loss_chunk_tokens: 8,
        // Off here so fused mode runs its single-pass schedule; tested below.
        skip_non_finite: false,
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
        gradient_blocks_in_flight: 1,
    }
}
