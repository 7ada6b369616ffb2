//! Llama and the families built like it: RMSNorm, rotary position embeddings
//! (the "rotate half" layout of the Hugging Face checkpoints, with Llama 3's
//! or linear frequency scaling), SwiGLU MLP, grouped-query attention, a tied
//! or untied head. Mistral adds a sliding attention window, Qwen2 biases on
//! the query/key/value projections, Qwen3 an RMSNorm on each query and key
//! head and a head size of its own (docs/ARCHITECTURE.md §5).

use burn::module::{Initializer, Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::{backend::Backend, Int, Tensor};
use burn_offload::{BlockModel, DecoderBlock, Documents};
use serde::{Deserialize, Serialize};

use crate::checks::{check_heads, check_positive, ConfigError};
use crate::kv_cache::{cached_attention, CachedBlock, CachedModel, LayerCache};
use crate::lora::{forward_lora, Lora};
pub use crate::rope::{
    apply_rope, apply_rope_rows, cached_rope_tables, document_rope_tables, rope_tables, RopeScaling,
};
use crate::tokens::{forward_tokens, linear_tokens};
use burn_offload::ops::attention::{
    causal_attention, causal_attention_in, windowed_attention, windowed_attention_in,
};
use burn_offload::ops::mlp::swiglu_mlp;
use burn_offload::ops::swiglu::swiglu;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub d_model: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// Key/value heads (grouped-query attention); `n_head` for plain multi-head.
    pub n_kv_head: usize,
    /// Hidden size of the SwiGLU MLP.
    pub d_ff: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_rms_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_max_seq_len")]
    pub max_seq_len: usize,
    /// Size of each attention head; `d_model / n_head` when absent (Qwen3
    /// and some Llama checkpoints set it apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Rescaled rotary frequencies (Llama 3.x, linear interpolation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// Which attention projections carry a bias.
    #[serde(default, skip_serializing_if = "AttentionBias::is_none")]
    pub attention_bias: AttentionBias,
    /// Biases on the MLP's three projections.
    #[serde(default, skip_serializing_if = "is_false")]
    pub mlp_bias: bool,
    /// RMSNorm over `head_dim` on each query and key head before the
    /// rotation (Qwen3).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qk_norm: bool,
    /// The LM head is the token embedding's transpose (no weight of its own).
    #[serde(default, skip_serializing_if = "is_false")]
    pub tie_embeddings: bool,
    /// Each position attends to at most this many positions (itself
    /// included; Mistral): `burn_offload::ops::attention::windowed_attention`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// The Hugging Face family the model is exported as.
    #[serde(default, skip_serializing_if = "Family::is_llama")]
    pub family: Family,
}

/// Which attention projections carry a bias.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionBias {
    /// None (Llama 2/3, Mistral, Qwen3).
    #[default]
    None,
    /// Query, key and value (Qwen2).
    Qkv,
    /// Query, key, value and output (Llama's `attention_bias: true`).
    All,
}

impl AttentionBias {
    fn is_none(&self) -> bool {
        *self == AttentionBias::None
    }
}

/// The Hugging Face architecture a Llama-shaped model belongs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    #[default]
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

impl Family {
    fn is_llama(&self) -> bool {
        *self == Family::Llama
    }

    /// `model_type` in `config.json`.
    pub fn model_type(&self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }

    /// The `transformers` class of the causal LM.
    pub fn architecture(&self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_rms_eps() -> f64 {
    1e-5
}
fn default_max_seq_len() -> usize {
    4096
}

impl LlamaConfig {
    pub fn tiny() -> Self {
        Self {
            max_seq_len: 256,
            ..Self::shape(256, 64, 2, 4, 2, 176, 10_000.0)
        }
    }
    /// Llama 3.2 1B shape (with an untied head).
    pub fn llama_1b() -> Self {
        Self::shape(128_256, 2048, 16, 32, 8, 8192, 500_000.0)
    }
    /// Llama 3.2 3B shape (with an untied head).
    pub fn llama_3b() -> Self {
        Self::shape(128_256, 3072, 28, 24, 8, 8192, 500_000.0)
    }
    /// Llama 2 7B.
    pub fn llama_7b() -> Self {
        Self::shape(32_000, 4096, 32, 32, 32, 11_008, 10_000.0)
    }
    /// Llama 3 8B.
    pub fn llama_8b() -> Self {
        Self::shape(128_256, 4096, 32, 32, 8, 14_336, 500_000.0)
    }

    /// Llama 3.2 1B as published: tied head, Llama 3 rope scaling (×32).
    pub fn llama_3_2_1b() -> Self {
        Self {
            tie_embeddings: true,
            ..Self::llama3(Self::shape(128_256, 2048, 16, 32, 8, 8192, 500_000.0), 32.0)
        }
    }
    /// Llama 3.2 3B as published: tied head, Llama 3 rope scaling (×32).
    pub fn llama_3_2_3b() -> Self {
        Self {
            tie_embeddings: true,
            ..Self::llama3(Self::shape(128_256, 3072, 28, 24, 8, 8192, 500_000.0), 32.0)
        }
    }
    /// Llama 3.1 8B as published: untied head, Llama 3 rope scaling (×8).
    pub fn llama_3_1_8b() -> Self {
        Self::llama3(
            Self::shape(128_256, 4096, 32, 32, 8, 14_336, 500_000.0),
            8.0,
        )
    }
    /// Llama 3.1 70B as published: untied head, Llama 3 rope scaling (×8).
    pub fn llama_3_1_70b() -> Self {
        Self::llama3(
            Self::shape(128_256, 8192, 80, 64, 8, 28_672, 500_000.0),
            8.0,
        )
    }
    /// Llama 3.1 405B as published: untied head, Llama 3 rope scaling (×8).
    pub fn llama_3_1_405b() -> Self {
        Self::llama3(
            Self::shape(128_256, 16_384, 126, 128, 8, 53_248, 500_000.0),
            8.0,
        )
    }
    /// Mistral 7B (v0.1): grouped-query attention, a 4096-token sliding window.
    pub fn mistral_7b() -> Self {
        Self {
            sliding_window: Some(4096),
            max_seq_len: 32_768,
            family: Family::Mistral,
            ..Self::shape(32_000, 4096, 32, 32, 8, 14_336, 10_000.0)
        }
    }
    /// Qwen2.5 (`vocab`, `d_model`, layers, heads, key/value heads, MLP
    /// size, tied head): biases on q, k and v.
    fn qwen2(shape: (usize, usize, usize, usize, usize, usize), tied: bool) -> Self {
        let (vocab, d, layers, heads, kv, ff) = shape;
        Self {
            attention_bias: AttentionBias::Qkv,
            tie_embeddings: tied,
            rms_norm_eps: 1e-6,
            max_seq_len: 32_768,
            family: Family::Qwen2,
            ..Self::shape(vocab, d, layers, heads, kv, ff, 1_000_000.0)
        }
    }
    pub fn qwen2_5_0_5b() -> Self {
        Self::qwen2((151_936, 896, 24, 14, 2, 4864), true)
    }
    pub fn qwen2_5_1_5b() -> Self {
        Self::qwen2((151_936, 1536, 28, 12, 2, 8960), true)
    }
    pub fn qwen2_5_7b() -> Self {
        Self::qwen2((152_064, 3584, 28, 28, 4, 18_944), false)
    }
    pub fn qwen2_5_14b() -> Self {
        Self::qwen2((152_064, 5120, 48, 40, 8, 13_824), false)
    }
    pub fn qwen2_5_32b() -> Self {
        Self::qwen2((152_064, 5120, 64, 40, 8, 27_648), false)
    }
    pub fn qwen2_5_72b() -> Self {
        Self::qwen2((152_064, 8192, 80, 64, 8, 29_568), false)
    }
    /// Qwen3 (`d_model`, layers, heads, key/value heads, MLP size, tied
    /// head): 128-wide heads whatever `d_model`, RMSNorm on queries and keys.
    fn qwen3(shape: (usize, usize, usize, usize, usize), tied: bool) -> Self {
        let (d, layers, heads, kv, ff) = shape;
        Self {
            head_dim: Some(128),
            qk_norm: true,
            tie_embeddings: tied,
            rms_norm_eps: 1e-6,
            max_seq_len: 40_960,
            family: Family::Qwen3,
            ..Self::shape(151_936, d, layers, heads, kv, ff, 1_000_000.0)
        }
    }
    pub fn qwen3_0_6b() -> Self {
        Self::qwen3((1024, 28, 16, 8, 3072), true)
    }
    pub fn qwen3_4b() -> Self {
        Self::qwen3((2560, 36, 32, 8, 9728), true)
    }
    pub fn qwen3_8b() -> Self {
        Self::qwen3((4096, 36, 32, 8, 12_288), false)
    }
    pub fn qwen3_14b() -> Self {
        Self::qwen3((5120, 40, 40, 8, 17_408), false)
    }

    /// `base` with Llama 3's rope scaling by `factor` (the published
    /// low/high frequency factors 1 and 4 over an 8192-token original context).
    fn llama3(base: Self, factor: f64) -> Self {
        Self {
            rope_scaling: Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            }),
            max_seq_len: 131_072,
            ..base
        }
    }

    fn shape(
        vocab_size: usize,
        d_model: usize,
        n_layer: usize,
        n_head: usize,
        n_kv_head: usize,
        d_ff: usize,
        rope_theta: f64,
    ) -> Self {
        Self {
            vocab_size,
            d_model,
            n_layer,
            n_head,
            n_kv_head,
            d_ff,
            rope_theta,
            rms_norm_eps: default_rms_eps(),
            max_seq_len: default_max_seq_len(),
            head_dim: None,
            rope_scaling: None,
            attention_bias: AttentionBias::None,
            mlp_bias: false,
            qk_norm: false,
            tie_embeddings: false,
            sliding_window: None,
            family: Family::Llama,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.n_head.max(1))
    }

    /// The longest sequence the model takes: its context (a sliding window
    /// shorter than that limits what each position sees, not the sequence).
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// The rotation's inverse frequencies, one per pair of head columns.
    pub fn inv_freqs(&self) -> Vec<f64> {
        let head_dim = self.head_dim();
        (0..head_dim / 2)
            .map(|j| {
                let inv_freq = self.rope_theta.powf(-2.0 * j as f64 / head_dim as f64);
                self.rope_scaling
                    .map_or(inv_freq, |scaling| scaling.scale(inv_freq))
            })
            .collect()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_positive(&[
            ("vocab_size", self.vocab_size),
            ("n_layer", self.n_layer),
            ("d_ff", self.d_ff),
            ("max_seq_len", self.max_seq_len),
        ])?;
        match self.head_dim {
            // Heads of their own size: only the grouping must divide.
            Some(head_dim) => {
                check_positive(&[("head_dim", head_dim)])?;
                check_heads(self.n_head, self.n_head, self.n_kv_head)?;
            }
            None => check_heads(self.d_model, self.n_head, self.n_kv_head)?,
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(ConfigError::Invalid(format!(
                "head_dim {} must be even for rotary embeddings",
                self.head_dim()
            )));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(ConfigError::Invalid("rope_theta must be positive".into()));
        }
        if let Some(scaling) = &self.rope_scaling {
            scaling.validate()?;
        }
        if self.sliding_window == Some(0) {
            return Err(ConfigError::Invalid(
                "sliding_window must be positive".into(),
            ));
        }
        Ok(())
    }

    /// Parameters of one decoder block: the attention and MLP projections
    /// with their biases, the two norms and the q/k norms.
    pub fn block_params(&self) -> usize {
        let (d, hd) = (self.d_model, self.head_dim());
        let (q, kv) = (self.n_head * hd, self.n_kv_head * hd);
        let attention = 2 * d * q + 2 * d * kv;
        let attention_bias = match self.attention_bias {
            AttentionBias::None => 0,
            AttentionBias::Qkv => q + 2 * kv,
            AttentionBias::All => q + 2 * kv + d,
        };
        let mlp = 3 * d * self.d_ff + if self.mlp_bias { 2 * self.d_ff + d } else { 0 };
        let norms = 2 * d + if self.qk_norm { 2 * hd } else { 0 };
        attention + attention_bias + mlp + norms
    }

    /// Parameters outside the blocks: the embedding, the final norm and the
    /// LM head unless it is tied to the embedding.
    pub fn stem_params(&self) -> usize {
        let d = self.d_model;
        let head = if self.tie_embeddings {
            0
        } else {
            self.vocab_size * d
        };
        self.vocab_size * d + head + d
    }

    pub fn num_params(&self) -> usize {
        self.stem_params() + self.n_layer * self.block_params()
    }

    /// Random initialisation: N(0, 0.02) everywhere, output projections scaled by
    /// 1/sqrt(2·n_layer), biases to zero, norms to identity.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Llama<B> {
        let std = 0.02;
        let residual_std = std / (2.0 * self.n_layer as f64).sqrt();
        let normal = |std: f64| Initializer::Normal { mean: 0.0, std };
        let (d, hd) = (self.d_model, self.head_dim());
        let linear = |d_in, d_out, std, bias: bool| {
            LinearConfig::new(d_in, d_out)
                .with_bias(bias)
                .with_initializer(normal(std))
                .init(device)
        };
        let norm = |size| {
            RmsNormConfig::new(size)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        let qkv_bias = self.attention_bias != AttentionBias::None;
        let o_bias = self.attention_bias == AttentionBias::All;
        let block = |_| LlamaBlock {
            input_layernorm: norm(d),
            attn: LlamaAttention {
                q_proj: linear(d, self.n_head * hd, std, qkv_bias),
                k_proj: linear(d, self.n_kv_head * hd, std, qkv_bias),
                v_proj: linear(d, self.n_kv_head * hd, std, qkv_bias),
                o_proj: linear(self.n_head * hd, d, residual_std, o_bias),
                q_norm: self.qk_norm.then(|| norm(hd)),
                k_norm: self.qk_norm.then(|| norm(hd)),
                n_head: self.n_head,
                n_kv_head: self.n_kv_head,
                inv_freqs: self.inv_freqs(),
                sliding_window: self.sliding_window,
                q_lora: None,
                k_lora: None,
                v_lora: None,
                o_lora: None,
            },
            post_attention_layernorm: norm(d),
            mlp: LlamaMlp {
                gate_proj: linear(d, self.d_ff, std, self.mlp_bias),
                up_proj: linear(d, self.d_ff, std, self.mlp_bias),
                down_proj: linear(self.d_ff, d, residual_std, self.mlp_bias),
                tile_tokens: None,
                gate_lora: None,
                up_lora: None,
                down_lora: None,
            },
        };
        Llama {
            embed_tokens: EmbeddingConfig::new(self.vocab_size, d)
                .with_initializer(normal(std))
                .init(device),
            layers: (0..self.n_layer).map(block).collect(),
            norm: norm(d),
            lm_head: (!self.tie_embeddings).then(|| linear(d, self.vocab_size, std, false)),
        }
    }
}

#[derive(Module, Debug)]
pub struct Llama<B: Backend> {
    pub embed_tokens: Embedding<B>,
    pub layers: Vec<LlamaBlock<B>>,
    pub norm: RmsNorm<B>,
    /// `None` for a tied head (the embedding's transpose).
    pub lm_head: Option<Linear<B>>,
}

#[derive(Module, Debug)]
pub struct LlamaBlock<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub attn: LlamaAttention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub mlp: LlamaMlp<B>,
}

#[derive(Module, Debug)]
pub struct LlamaAttention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Linear<B>,
    pub v_proj: Linear<B>,
    pub o_proj: Linear<B>,
    /// Per-head RMSNorm of queries and keys (Qwen3).
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
    pub n_head: usize,
    pub n_kv_head: usize,
    /// The rotation's inverse frequencies ([`LlamaConfig::inv_freqs`]).
    #[module(skip)]
    pub inv_freqs: Vec<f64>,
    /// [`LlamaConfig::sliding_window`].
    #[module(skip)]
    pub sliding_window: Option<usize>,
    /// LoRA adapters beside the four projections (`crate::lora`): last, so
    /// that the projections' names and visit order stay those of checkpoints.
    pub q_lora: Option<Lora<B>>,
    /// Beside `k_proj`.
    pub k_lora: Option<Lora<B>>,
    /// Beside `v_proj`.
    pub v_lora: Option<Lora<B>>,
    /// Beside `o_proj`.
    pub o_lora: Option<Lora<B>>,
}

#[derive(Module, Debug)]
pub struct LlamaMlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
    /// Run as one operation over tiles of this many tokens, which keeps
    /// only its input for the backward (`burn_offload::ops::mlp`): for long
    /// sequences, where the five `[tokens, d_ff]` values a plain MLP keeps do
    /// not fit. Set by [`Llama::with_mlp_tiles`]; projections with biases
    /// run plain.
    #[module(skip)]
    pub tile_tokens: Option<usize>,
    /// LoRA adapters beside the three projections (`crate::lora`), last
    /// for the same reason as [`LlamaAttention::q_lora`].
    pub gate_lora: Option<Lora<B>>,
    /// Beside `up_proj`.
    pub up_lora: Option<Lora<B>>,
    /// Beside `down_proj`.
    pub down_lora: Option<Lora<B>>,
}

impl<B: Backend> LlamaMlp<B> {
    /// `down(silu(gate(h)) ⊙ up(h))` for `h: [batch, seq, d]`.
    pub fn forward(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        let unbiased = [&self.gate_proj, &self.up_proj, &self.down_proj]
            .iter()
            .all(|l| l.bias.is_none());
        // The fused kernel takes the three weights alone; an adapter's
        // update is a separate term, so adapted MLPs run plain.
        let adapted = [&self.gate_lora, &self.up_lora, &self.down_lora]
            .iter()
            .any(|l| l.is_some());
        match self.tile_tokens {
            Some(tile) if unbiased && !adapted => {
                let [batch, seq, d] = h.dims();
                let weight = |l: &Linear<B>| l.weight.val();
                swiglu_mlp(
                    h.reshape([batch * seq, d]),
                    weight(&self.gate_proj),
                    weight(&self.up_proj),
                    weight(&self.down_proj),
                    tile,
                )
                .reshape([batch, seq, d])
            }
            // `silu(gate) ⊙ up` as one operation (one kernel each way on CUDA).
            _ => {
                let gated = swiglu(
                    forward_lora(&self.gate_proj, &self.gate_lora, h.clone()),
                    forward_lora(&self.up_proj, &self.up_lora, h),
                );
                forward_lora(&self.down_proj, &self.down_lora, gated)
            }
        }
    }
}

/// RMSNorm as one operation each way (`burn_offload::ops::rms_norm`): burn's
/// `RmsNorm::forward` computed in f32 and rounded once, without its five
/// passes and their autodiff records (a kernel each way on CUDA).
fn rms_norm<B: Backend, const D: usize>(norm: &RmsNorm<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    burn_offload::ops::rms_norm::rms_norm(x, norm.gamma.val(), norm.epsilon)
}

impl<B: Backend> LlamaAttention<B> {
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward_with(x, None)
    }

    /// [`LlamaAttention::forward`] of rows packed as `documents`: attention
    /// stays inside each document and the rotary positions restart at each
    /// one's start.
    pub fn forward_in(&self, x: Tensor<B, 3>, documents: &Documents) -> Tensor<B, 3> {
        self.forward_with(x, Some(documents).filter(|d| !d.is_whole()))
    }

    /// Queries, keys and values of `x`, `[batch, heads, seq, head_dim]`,
    /// each head normalised where the model says so, not yet rotated.
    fn project(&self, x: Tensor<B, 3>) -> [Tensor<B, 4>; 3] {
        let [batch, seq, _] = x.dims();
        let head_dim = 2 * self.inv_freqs.len();
        // `[batch, seq, n·head_dim]` → `[batch, n, seq, head_dim]`, each head
        // normalised first where the model says so (rows still contiguous).
        let heads = |t: Tensor<B, 3>, n, norm: &Option<RmsNorm<B>>| {
            let t = t.reshape([batch, seq, n, head_dim]);
            let t = match norm {
                Some(norm) => rms_norm(norm, t),
                None => t,
            };
            t.swap_dims(1, 2)
        };
        [
            heads(
                forward_lora(&self.q_proj, &self.q_lora, x.clone()),
                self.n_head,
                &self.q_norm,
            ),
            heads(
                forward_lora(&self.k_proj, &self.k_lora, x.clone()),
                self.n_kv_head,
                &self.k_norm,
            ),
            heads(
                forward_lora(&self.v_proj, &self.v_lora, x),
                self.n_kv_head,
                &None,
            ),
        ]
    }

    /// The output projection of the heads' attention `y: [batch, heads, seq, head_dim]`.
    fn output(&self, y: Tensor<B, 4>) -> Tensor<B, 3> {
        let [batch, heads, seq, head_dim] = y.dims();
        forward_lora(
            &self.o_proj,
            &self.o_lora,
            y.swap_dims(1, 2).reshape([batch, seq, heads * head_dim]),
        )
    }

    fn forward_with(&self, x: Tensor<B, 3>, documents: Option<&Documents>) -> Tensor<B, 3> {
        let seq = x.dims()[1];
        let device = x.device();
        let [q, k, v] = self.project(x);
        // Grouped-query attention: each key/value head serves `n_head /
        // n_kv_head` consecutive query heads.
        let y = match documents {
            None => {
                let (cos, sin) = cached_rope_tables::<B>(seq, &self.inv_freqs, &device);
                let (q, k) = (apply_rope(q, &cos, &sin), apply_rope(k, &cos, &sin));
                match self.sliding_window {
                    Some(window) => windowed_attention(q, k, v, window),
                    None => causal_attention(q, k, v),
                }
            }
            Some(documents) => {
                let (cos, sin) = document_rope_tables::<B>(documents, &self.inv_freqs, &device);
                let (q, k) = (
                    apply_rope_rows(q, &cos, &sin),
                    apply_rope_rows(k, &cos, &sin),
                );
                match self.sliding_window {
                    Some(window) => windowed_attention_in(q, k, v, window, documents),
                    None => causal_attention_in(q, k, v, documents),
                }
            }
        };
        self.output(y)
    }

    /// [`LlamaAttention::forward`] of `x` at positions `start..`, attending
    /// to the earlier positions in `cache`, which its keys and values join.
    pub fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        start: usize,
    ) -> Tensor<B, 3> {
        let seq = x.dims()[1];
        let device = x.device();
        let [q, k, v] = self.project(x);
        let (cos, sin) = cached_rope_tables::<B>(start + seq, &self.inv_freqs, &device);
        let (cos, sin) = (cos.narrow(0, start, seq), sin.narrow(0, start, seq));
        let (q, k) = (apply_rope(q, &cos, &sin), apply_rope(k, &cos, &sin));
        self.output(cached_attention(cache, q, k, v, start, self.sliding_window))
    }
}

impl<B: Backend> LlamaBlock<B> {
    fn forward_with(&self, x: Tensor<B, 3>, documents: Option<&Documents>) -> Tensor<B, 3> {
        let normed = rms_norm(&self.input_layernorm, x.clone());
        let attended = match documents {
            Some(documents) => self.attn.forward_in(normed, documents),
            None => self.attn.forward(normed),
        };
        self.mlp_residual(x + attended)
    }

    /// `x` plus the MLP of its normalised value: the block after attention.
    fn mlp_residual(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let h = rms_norm(&self.post_attention_layernorm, x.clone());
        x + self.mlp.forward(h)
    }
}

impl<B: Backend> CachedBlock<B> for LlamaBlock<B> {
    fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        start: usize,
    ) -> Tensor<B, 3> {
        let normed = rms_norm(&self.input_layernorm, x.clone());
        self.mlp_residual(x + self.attn.forward_cached(normed, cache, start))
    }
}

impl<B: Backend> DecoderBlock<B> for LlamaBlock<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward_with(x, None)
    }

    fn forward_in(&self, x: Tensor<B, 3>, documents: &Documents) -> Tensor<B, 3> {
        self.forward_with(x, Some(documents))
    }
}

impl<B: Backend> Llama<B> {
    /// The model with every block's MLP run over tiles of `tile` tokens
    /// (`None`: plain), see [`LlamaMlp::tile_tokens`].
    pub fn with_mlp_tiles(mut self, tile: Option<usize>) -> Self {
        for layer in &mut self.layers {
            layer.mlp.tile_tokens = tile;
        }
        self
    }
}

/// Positions live in the blocks' rotations: the lookup at any offset.
impl<B: Backend> CachedModel<B> for Llama<B> {
    fn embed_at(&self, tokens: Tensor<B, 2, Int>, _start: usize) -> Tensor<B, 3> {
        self.embed(tokens)
    }
}

impl<B: Backend> BlockModel<B> for Llama<B> {
    type Block = LlamaBlock<B>;

    fn embed(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.embed_tokens.forward(tokens)
    }

    /// The lookup: positions live in the blocks' rotations.
    fn embed_in(&self, tokens: Tensor<B, 2, Int>, _: &Documents) -> Tensor<B, 3> {
        self.embed(tokens)
    }

    fn blocks(&self) -> &[LlamaBlock<B>] {
        &self.layers
    }

    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let hidden = rms_norm(&self.norm, hidden);
        match &self.lm_head {
            Some(lm_head) => forward_tokens(lm_head, hidden),
            None => linear_tokens(hidden, self.embed_tokens.weight.val().transpose(), None),
        }
    }

    fn vocab_size(&self) -> usize {
        self.embed_tokens.weight.dims()[0]
    }

    /// The table, where the head does not read it too: a tied head's
    /// gradient reaches the table through burn's autodiff, which must then
    /// differentiate the lookup as well.
    fn embedding_table(&self) -> Option<&Param<Tensor<B, 2>>> {
        self.lm_head.is_some().then_some(&self.embed_tokens.weight)
    }
}
