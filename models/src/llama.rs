//! Llama: RMSNorm, rotary position embeddings (the "rotate half" layout of the
//! Hugging Face checkpoints), SwiGLU MLP, grouped-query attention, untied head.

use std::any::{Any, TypeId};
use std::sync::Mutex;

use burn::module::{Initializer, Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use burn_offload::{BlockModel, DecoderBlock};
use serde::{Deserialize, Serialize};

use crate::config::{check_heads, check_positive, ConfigError};
use crate::tokens::forward_tokens;
use burn_offload::attention::causal_attention;
use burn_offload::rotary::rotate_half;
use burn_offload::swiglu::swiglu;

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
        }
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_head
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_positive(&[
            ("vocab_size", self.vocab_size),
            ("n_layer", self.n_layer),
            ("d_ff", self.d_ff),
            ("max_seq_len", self.max_seq_len),
        ])?;
        check_heads(self.d_model, self.n_head, self.n_kv_head)?;
        if !self.head_dim().is_multiple_of(2) {
            return Err(ConfigError::Invalid(format!(
                "head_dim {} must be even for rotary embeddings",
                self.head_dim()
            )));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(ConfigError::Invalid("rope_theta must be positive".into()));
        }
        Ok(())
    }

    pub fn num_params(&self) -> usize {
        let (d, kv) = (self.d_model, self.n_kv_head * self.head_dim());
        let block = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * self.d_ff;
        2 * self.vocab_size * d + self.n_layer * block + d
    }

    /// Random initialisation: N(0, 0.02) everywhere, output projections scaled by
    /// 1/sqrt(2·n_layer), norms to identity.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Llama<B> {
        let std = 0.02;
        let residual_std = std / (2.0 * self.n_layer as f64).sqrt();
        let normal = |std: f64| Initializer::Normal { mean: 0.0, std };
        let (d, hd) = (self.d_model, self.head_dim());
        let linear = |d_in, d_out, std| {
            LinearConfig::new(d_in, d_out)
                .with_bias(false)
                .with_initializer(normal(std))
                .init(device)
        };
        let norm = || {
            RmsNormConfig::new(d)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        let block = |_| LlamaBlock {
            input_layernorm: norm(),
            attn: LlamaAttention {
                q_proj: linear(d, self.n_head * hd, std),
                k_proj: linear(d, self.n_kv_head * hd, std),
                v_proj: linear(d, self.n_kv_head * hd, std),
                o_proj: linear(self.n_head * hd, d, residual_std),
                n_head: self.n_head,
                n_kv_head: self.n_kv_head,
                rope_theta: self.rope_theta,
            },
            post_attention_layernorm: norm(),
            mlp: LlamaMlp {
                gate_proj: linear(d, self.d_ff, std),
                up_proj: linear(d, self.d_ff, std),
                down_proj: linear(self.d_ff, d, residual_std),
            },
        };
        Llama {
            embed_tokens: EmbeddingConfig::new(self.vocab_size, d)
                .with_initializer(normal(std))
                .init(device),
            layers: (0..self.n_layer).map(block).collect(),
            norm: norm(),
            lm_head: linear(d, self.vocab_size, std),
        }
    }
}

#[derive(Module, Debug)]
pub struct Llama<B: Backend> {
    pub embed_tokens: Embedding<B>,
    pub layers: Vec<LlamaBlock<B>>,
    pub norm: RmsNorm<B>,
    pub lm_head: Linear<B>,
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
    pub n_head: usize,
    pub n_kv_head: usize,
    pub rope_theta: f64,
}

#[derive(Module, Debug)]
pub struct LlamaMlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
}

/// Rotary tables `(cos, sin)`, each `[seq, head_dim]`: position `t`, column `j`
/// holds `cos(t · θ^(-2(j mod h/2)/h))` (halves repeated, HF layout). Computed
/// in f64 on the host so every backend sees the same angles.
pub fn rope_tables<B: Backend>(
    seq: usize,
    head_dim: usize,
    theta: f64,
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(seq * head_dim);
    let mut sin = Vec::with_capacity(seq * head_dim);
    for t in 0..seq {
        for j in 0..head_dim {
            let inv_freq = theta.powf(-2.0 * (j % half) as f64 / head_dim as f64);
            let angle = t as f64 * inv_freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let table = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, [seq, head_dim]), device);
    (table(cos), table(sin))
}

/// [`rope_tables`] for `seq` positions, built once per backend, device, head
/// size and θ and shared by every block and step: the tables for the longest
/// sequence asked for so far (rounded up to a power of two), narrowed to `seq`
/// (a row depends only on its position, so the values are those of
/// [`rope_tables`]). Built per call, each block's forward computed the angles
/// on the thread that submits the kernels and uploaded them, a copy that on
/// the GPU queued behind the next block's weight prefetch: the device waited
/// 1.5–3.3 ms for it in most blocks of the forward (bench run25).
pub fn cached_rope_tables<B: Backend>(
    seq: usize,
    head_dim: usize,
    theta: f64,
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    struct Entry {
        key: (TypeId, String, usize, u64),
        positions: usize,
        tables: Box<dyn Any + Send>,
    }
    static CACHE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

    let key = (
        TypeId::of::<B>(),
        format!("{device:?}"),
        head_dim,
        theta.to_bits(),
    );
    // A panic elsewhere while the lock was held cannot leave an entry half
    // written (entries are replaced whole): the cache stays usable.
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let at = match cache.iter().position(|e| e.key == key) {
        Some(at) if cache[at].positions >= seq => at,
        found => {
            let positions = seq.next_power_of_two();
            let entry = Entry {
                key,
                positions,
                tables: Box::new(rope_tables::<B>(positions, head_dim, theta, device)),
            };
            match found {
                Some(at) => {
                    cache[at] = entry;
                    at
                }
                None => {
                    cache.push(entry);
                    cache.len() - 1
                }
            }
        }
    };
    let (cos, sin) = cache[at]
        .tables
        .downcast_ref::<(Tensor<B, 2>, Tensor<B, 2>)>()
        .expect("the key holds the backend type");
    if cache[at].positions == seq {
        (cos.clone(), sin.clone())
    } else {
        (cos.clone().narrow(0, 0, seq), sin.clone().narrow(0, 0, seq))
    }
}

/// Rotates `x [batch, heads, seq, head_dim]`: `x·cos + rotate_half(x)·sin`, where
/// `rotate_half([a, b]) = [-b, a]` over the two halves of the head dimension, in
/// `x`'s dtype: one operation each way (`burn_offload::rotary`), a kernel on CUDA.
pub fn apply_rope<B: Backend>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 2>,
    sin: &Tensor<B, 2>,
) -> Tensor<B, 4> {
    rotate_half(x, cos, sin)
}

/// RMSNorm as one operation each way (`burn_offload::rms_norm`): burn's
/// `RmsNorm::forward` computed in f32 and rounded once, without its five
/// passes and their autodiff records (a kernel each way on CUDA).
fn rms_norm<B: Backend, const D: usize>(norm: &RmsNorm<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    burn_offload::rms_norm::rms_norm(x, norm.gamma.val(), norm.epsilon)
}

impl<B: Backend> LlamaAttention<B> {
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq, _] = x.dims();
        let head_dim = self.q_proj.weight.dims()[1] / self.n_head;
        let heads = |t: Tensor<B, 3>, n| t.reshape([batch, seq, n, head_dim]).swap_dims(1, 2);
        let q = heads(forward_tokens(&self.q_proj, x.clone()), self.n_head);
        let k = heads(forward_tokens(&self.k_proj, x.clone()), self.n_kv_head);
        let v = heads(forward_tokens(&self.v_proj, x.clone()), self.n_kv_head);

        let (cos, sin) = cached_rope_tables::<B>(seq, head_dim, self.rope_theta, &x.device());
        let (q, k) = (apply_rope(q, &cos, &sin), apply_rope(k, &cos, &sin));

        // Grouped-query attention: each key/value head serves `n_head /
        // n_kv_head` consecutive query heads.
        let y = causal_attention(q, k, v);
        forward_tokens(
            &self.o_proj,
            y.swap_dims(1, 2)
                .reshape([batch, seq, self.n_head * head_dim]),
        )
    }
}

impl<B: Backend> DecoderBlock<B> for LlamaBlock<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = x.clone() + self.attn.forward(rms_norm(&self.input_layernorm, x));
        let h = rms_norm(&self.post_attention_layernorm, x.clone());
        // `silu(gate) ⊙ up` as one operation (one kernel each way on CUDA).
        let gated = swiglu(
            forward_tokens(&self.mlp.gate_proj, h.clone()),
            forward_tokens(&self.mlp.up_proj, h),
        );
        x + forward_tokens(&self.mlp.down_proj, gated)
    }
}

impl<B: Backend> BlockModel<B> for Llama<B> {
    type Block = LlamaBlock<B>;

    fn embed(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.embed_tokens.forward(tokens)
    }

    fn blocks(&self) -> &[LlamaBlock<B>] {
        &self.layers
    }

    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        forward_tokens(&self.lm_head, rms_norm(&self.norm, hidden))
    }

    fn vocab_size(&self) -> usize {
        self.lm_head.weight.dims()[1]
    }

    fn embedding_table(&self) -> Option<&Param<Tensor<B, 2>>> {
        Some(&self.embed_tokens.weight)
    }
}
