//! Where each model's adapters sit: [`LoraModel`] for Llama and GPT-2,
//! naming each projection by its Hugging Face module path (PEFT matches
//! `target_modules` against those, and its files are keyed by them).
//! Kept out of `lora.rs` so that the models import the adapter module and
//! not the other way round.

use burn::tensor::backend::Backend;

use crate::gpt2::Gpt2;
use crate::llama::Llama;
use crate::lora::{LoraModel, Slot, SlotMut, SlotRef};

/// The slots of one module tree, shared (`iter`, `&`) or mutable
/// (`iter_mut`, `&mut`): one list, so the two cannot disagree.
macro_rules! llama_slots {
    ($model:expr, $iter:ident, $($r:tt)+) => {{
        let mut slots = Vec::new();
        for (i, layer) in $model.layers.$iter().enumerate() {
            let (attn, mlp) = ($($r)+ layer.attn, $($r)+ layer.mlp);
            let at = |n: &str| format!("model.layers.{i}.self_attn.{n}");
            let mlp_at = |n: &str| format!("model.layers.{i}.mlp.{n}");
            slots.extend([
                Slot { path: at("q_proj"), base: $($r)+ attn.q_proj, lora: $($r)+ attn.q_lora },
                Slot { path: at("k_proj"), base: $($r)+ attn.k_proj, lora: $($r)+ attn.k_lora },
                Slot { path: at("v_proj"), base: $($r)+ attn.v_proj, lora: $($r)+ attn.v_lora },
                Slot { path: at("o_proj"), base: $($r)+ attn.o_proj, lora: $($r)+ attn.o_lora },
                Slot { path: mlp_at("gate_proj"), base: $($r)+ mlp.gate_proj, lora: $($r)+ mlp.gate_lora },
                Slot { path: mlp_at("up_proj"), base: $($r)+ mlp.up_proj, lora: $($r)+ mlp.up_lora },
                Slot { path: mlp_at("down_proj"), base: $($r)+ mlp.down_proj, lora: $($r)+ mlp.down_lora },
            ]);
        }
        slots
    }};
}

macro_rules! gpt2_slots {
    ($model:expr, $iter:ident, $($r:tt)+) => {{
        let mut slots = Vec::new();
        for (i, block) in $model.blocks.$iter().enumerate() {
            let (attn, mlp) = ($($r)+ block.attn, $($r)+ block.mlp);
            let at = |n: &str| format!("transformer.h.{i}.{n}");
            slots.extend([
                Slot { path: at("attn.c_attn"), base: $($r)+ attn.c_attn, lora: $($r)+ attn.c_attn_lora },
                Slot { path: at("attn.c_proj"), base: $($r)+ attn.c_proj, lora: $($r)+ attn.c_proj_lora },
                Slot { path: at("mlp.c_fc"), base: $($r)+ mlp.c_fc, lora: $($r)+ mlp.c_fc_lora },
                Slot { path: at("mlp.c_proj"), base: $($r)+ mlp.c_proj, lora: $($r)+ mlp.c_proj_lora },
            ]);
        }
        slots
    }};
}

/// Attention's q, k, v, o and the MLP's gate, up and down projections.
impl<B: Backend> LoraModel<B> for Llama<B> {
    const KIND: &'static str = "a Llama-family model";
    const FAN_IN_FAN_OUT: bool = false;
    const EMBEDDINGS: &'static [&'static str] = &["embed_tokens", "lm_head"];

    fn slots(&self) -> Vec<SlotRef<'_, B>> {
        llama_slots!(self, iter, &)
    }

    fn slots_mut(&mut self) -> Vec<SlotMut<'_, B>> {
        llama_slots!(self, iter_mut, &mut)
    }
}

/// `c_attn` and `c_proj` in attention, `c_fc` and `c_proj` in the MLP.
/// The head is tied to `wte`, so `train_embeddings` keeps `wte` and `wpe`.
impl<B: Backend> LoraModel<B> for Gpt2<B> {
    const KIND: &'static str = "GPT-2";
    const FAN_IN_FAN_OUT: bool = true;
    const EMBEDDINGS: &'static [&'static str] = &["wte", "wpe"];

    fn slots(&self) -> Vec<SlotRef<'_, B>> {
        gpt2_slots!(self, iter, &)
    }

    fn slots_mut(&mut self) -> Vec<SlotMut<'_, B>> {
        gpt2_slots!(self, iter_mut, &mut)
    }
}
