//! GPT-2: learned positions, pre-LayerNorm, GELU MLP, LM head tied to the token
//! embedding. Parameter names follow the Hugging Face checkpoint (`wte`, `c_attn`, …).

use burn::module::{Initializer, Module};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::activation::gelu_approximate;
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use burn_offload::{BlockModel, DecoderBlock, Documents};
use serde::{Deserialize, Serialize};

use crate::checks::{check_heads, check_positive, ConfigError};
use crate::kv_cache::{cached_attention, CachedBlock, CachedModel, LayerCache};
use crate::lora::{forward_lora, Lora};
use crate::tokens::linear_tokens;
use burn_offload::ops::attention::{causal_attention, causal_attention_in};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpt2Config {
    pub vocab_size: usize,
    /// Number of learned positions (longest sequence).
    pub n_ctx: usize,
    pub d_model: usize,
    pub n_layer: usize,
    pub n_head: usize,
    #[serde(default = "default_ln_eps")]
    pub layer_norm_eps: f64,
}

fn default_ln_eps() -> f64 {
    1e-5
}

impl Gpt2Config {
    pub fn tiny() -> Self {
        Self::shape(256, 256, 64, 2, 4)
    }
    pub fn gpt2_124m() -> Self {
        Self::shape(50257, 1024, 768, 12, 12)
    }
    pub fn gpt2_xl() -> Self {
        Self::shape(50257, 1024, 1600, 48, 25)
    }

    fn shape(
        vocab_size: usize,
        n_ctx: usize,
        d_model: usize,
        n_layer: usize,
        n_head: usize,
    ) -> Self {
        Self {
            vocab_size,
            n_ctx,
            d_model,
            n_layer,
            n_head,
            layer_norm_eps: default_ln_eps(),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_positive(&[
            ("vocab_size", self.vocab_size),
            ("n_ctx", self.n_ctx),
            ("n_layer", self.n_layer),
        ])?;
        check_heads(self.d_model, self.n_head, self.n_head)
    }

    /// Parameters of one block: attention and MLP with their biases, two
    /// LayerNorms.
    pub fn block_params(&self) -> usize {
        let d = self.d_model;
        12 * d * d + 13 * d
    }

    /// Parameters outside the blocks: token and position embeddings and the
    /// final LayerNorm (the head is tied to the embedding).
    pub fn stem_params(&self) -> usize {
        let d = self.d_model;
        self.vocab_size * d + self.n_ctx * d + 2 * d
    }

    pub fn num_params(&self) -> usize {
        self.stem_params() + self.n_layer * self.block_params()
    }

    /// Random initialisation as in GPT-2: N(0, 0.02), residual projections scaled
    /// by 1/sqrt(2·n_layer), LayerNorm to identity.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Gpt2<B> {
        let std = 0.02;
        let normal = |std: f64| Initializer::Normal { mean: 0.0, std };
        let residual_std = std / (2.0 * self.n_layer as f64).sqrt();
        let d = self.d_model;
        let linear = |d_in, d_out, std| {
            LinearConfig::new(d_in, d_out)
                .with_initializer(normal(std))
                .init(device)
        };
        let block = |_| Gpt2Block {
            ln_1: LayerNormConfig::new(d)
                .with_epsilon(self.layer_norm_eps)
                .init(device),
            attn: Gpt2Attention {
                c_attn: linear(d, 3 * d, std),
                c_proj: linear(d, d, residual_std),
                n_head: self.n_head,
                c_attn_lora: None,
                c_proj_lora: None,
            },
            ln_2: LayerNormConfig::new(d)
                .with_epsilon(self.layer_norm_eps)
                .init(device),
            mlp: Gpt2Mlp {
                c_fc: linear(d, 4 * d, std),
                c_proj: linear(4 * d, d, residual_std),
                c_fc_lora: None,
                c_proj_lora: None,
            },
        };
        Gpt2 {
            wte: EmbeddingConfig::new(self.vocab_size, d)
                .with_initializer(normal(std))
                .init(device),
            wpe: EmbeddingConfig::new(self.n_ctx, d)
                .with_initializer(normal(0.01))
                .init(device),
            blocks: (0..self.n_layer).map(block).collect(),
            ln_f: LayerNormConfig::new(d)
                .with_epsilon(self.layer_norm_eps)
                .init(device),
        }
    }
}

#[derive(Module, Debug)]
pub struct Gpt2<B: Backend> {
    pub wte: Embedding<B>,
    pub wpe: Embedding<B>,
    pub blocks: Vec<Gpt2Block<B>>,
    pub ln_f: LayerNorm<B>,
}

#[derive(Module, Debug)]
pub struct Gpt2Block<B: Backend> {
    pub ln_1: LayerNorm<B>,
    pub attn: Gpt2Attention<B>,
    pub ln_2: LayerNorm<B>,
    pub mlp: Gpt2Mlp<B>,
}

#[derive(Module, Debug)]
pub struct Gpt2Attention<B: Backend> {
    /// Fused q, k, v projection `[d, 3d]`.
    pub c_attn: Linear<B>,
    pub c_proj: Linear<B>,
    pub n_head: usize,
    /// LoRA adapters beside the two projections (`crate::lora`): last, so
    /// that the projections' names and visit order stay those of checkpoints.
    pub c_attn_lora: Option<Lora<B>>,
    /// Beside `c_proj`.
    pub c_proj_lora: Option<Lora<B>>,
}

#[derive(Module, Debug)]
pub struct Gpt2Mlp<B: Backend> {
    pub c_fc: Linear<B>,
    pub c_proj: Linear<B>,
    /// LoRA adapters beside the two projections, last for the same reason
    /// as [`Gpt2Attention::c_attn_lora`].
    pub c_fc_lora: Option<Lora<B>>,
    /// Beside `c_proj`.
    pub c_proj_lora: Option<Lora<B>>,
}

impl<B: Backend> Gpt2Attention<B> {
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward_with(x, None)
    }

    /// [`Gpt2Attention::forward`] with attention inside each of the packed
    /// `documents`.
    pub fn forward_in(&self, x: Tensor<B, 3>, documents: &Documents) -> Tensor<B, 3> {
        self.forward_with(x, Some(documents))
    }

    /// Queries, keys and values of `x`, `[batch, heads, seq, head_dim]`.
    fn project(&self, x: Tensor<B, 3>) -> [Tensor<B, 4>; 3] {
        let [batch, seq, d] = x.dims();
        let head_dim = d / self.n_head;
        let qkv = forward_lora(&self.c_attn, &self.c_attn_lora, x).chunk(3, 2);
        let qkv: [Tensor<B, 3>; 3] = qkv.try_into().expect("chunk(3) gives three tensors");
        qkv.map(|t| {
            t.reshape([batch, seq, self.n_head, head_dim])
                .swap_dims(1, 2)
        })
    }

    /// The output projection of the heads' attention `y: [batch, heads, seq, head_dim]`.
    fn output(&self, y: Tensor<B, 4>) -> Tensor<B, 3> {
        let [batch, heads, seq, head_dim] = y.dims();
        forward_lora(
            &self.c_proj,
            &self.c_proj_lora,
            y.swap_dims(1, 2).reshape([batch, seq, heads * head_dim]),
        )
    }

    fn forward_with(&self, x: Tensor<B, 3>, documents: Option<&Documents>) -> Tensor<B, 3> {
        let [q, k, v] = self.project(x);
        self.output(match documents {
            Some(documents) => causal_attention_in(q, k, v, documents),
            None => causal_attention(q, k, v),
        })
    }

    /// [`Gpt2Attention::forward`] of `x` at positions `start..`, attending
    /// to the earlier positions in `cache`, which its keys and values join.
    pub fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        start: usize,
    ) -> Tensor<B, 3> {
        let [q, k, v] = self.project(x);
        self.output(cached_attention(cache, q, k, v, start, None))
    }
}

impl<B: Backend> Gpt2Block<B> {
    fn forward_with(&self, x: Tensor<B, 3>, documents: Option<&Documents>) -> Tensor<B, 3> {
        let attended = self
            .attn
            .forward_with(self.ln_1.forward(x.clone()), documents);
        self.mlp_residual(x + attended)
    }

    /// `x` plus the MLP of its normalised value: the block after attention.
    fn mlp_residual(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        // GPT-2 uses the tanh approximation ("gelu_new").
        let mlp = &self.mlp;
        let h = gelu_approximate(forward_lora(
            &mlp.c_fc,
            &mlp.c_fc_lora,
            self.ln_2.forward(x.clone()),
        ));
        x + forward_lora(&mlp.c_proj, &mlp.c_proj_lora, h)
    }
}

impl<B: Backend> CachedBlock<B> for Gpt2Block<B> {
    fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        start: usize,
    ) -> Tensor<B, 3> {
        let attended = self
            .attn
            .forward_cached(self.ln_1.forward(x.clone()), cache, start);
        self.mlp_residual(x + attended)
    }
}

impl<B: Backend> DecoderBlock<B> for Gpt2Block<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward_with(x, None)
    }

    fn forward_in(&self, x: Tensor<B, 3>, documents: &Documents) -> Tensor<B, 3> {
        self.forward_with(x, Some(documents))
    }
}

/// Learned positions counted from `start`.
impl<B: Backend> CachedModel<B> for Gpt2<B> {
    fn embed_at(&self, tokens: Tensor<B, 2, Int>, start: usize) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let positions =
            Tensor::<B, 1, Int>::arange(start as i64..(start + seq) as i64, &tokens.device())
                .reshape([1, seq])
                .expand([batch, seq]);
        self.wte.forward(tokens) + self.wpe.forward(positions)
    }
}

impl<B: Backend> BlockModel<B> for Gpt2<B> {
    type Block = Gpt2Block<B>;

    fn embed(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.embed_at(tokens, 0)
    }

    /// Learned positions counted from each document's start.
    fn embed_in(&self, tokens: Tensor<B, 2, Int>, documents: &Documents) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let positions = Tensor::<B, 2, Int>::from_data(
            TensorData::new(documents.positions(), [batch, seq]),
            &tokens.device(),
        );
        self.wte.forward(tokens) + self.wpe.forward(positions)
    }

    fn blocks(&self) -> &[Gpt2Block<B>] {
        &self.blocks
    }

    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        // Tied head: logits = ln_f(h) · wteᵀ.
        linear_tokens(
            self.ln_f.forward(hidden),
            self.wte.weight.val().transpose(),
            None,
        )
    }

    fn vocab_size(&self) -> usize {
        self.wte.weight.dims()[0]
    }
}
