//! LoRA adapters: a low-rank update `scale · B·A` beside a
//! frozen projection, as PEFT trains them.
//!
//! The models carry one `Option<Lora<B>>` beside each projection that can
//! take an adapter (`q_lora` beside `q_proj`, …), declared after the
//! struct's other fields and `None` unless [`LoraModel::with_lora`] adds
//! it: burn's derive visits fields in declaration order, so a model without
//! adapters has exactly the parameter names and order it had before, and
//! checkpoints and the Hugging Face loader, which key on them, are
//! unaffected. Which projections those are, and their Hugging Face names,
//! each model says by implementing [`LoraModel`] (`crate::adapters`).

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::{backend::Backend, Distribution, Tensor};
use serde::{Deserialize, Serialize};

use crate::tokens::{forward_tokens, linear_tokens};

/// A LoRA configuration that cannot be applied.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoraError {
    /// A target name no model knows.
    #[error("unknown LoRA target `{0}`; known: {known}", known = LoraTarget::NAMES.join(", "))]
    UnknownTarget(String),
    /// A known target that names no projection of this model (a GPT-2 name
    /// on a Llama, say).
    #[error("LoRA target `{target}` names no projection of {model}")]
    UnsupportedTarget {
        /// The target's name.
        target: String,
        /// The model's kind.
        model: &'static str,
    },
    /// A rank, alpha or dropout out of range, or no targets.
    #[error("invalid LoRA config: {0}")]
    Invalid(String),
    /// `with_lora` on a model that already carries adapters.
    #[error("the model already carries LoRA adapters; merge them first")]
    AlreadyAdapted,
}

/// A projection an adapter can sit beside, by its Hugging Face module name.
/// As in PEFT's `target_modules`, a name matches every module whose path
/// ends with it: `c_proj` is both of GPT-2's (attention output and MLP
/// output), `attn.c_proj` and `mlp.c_proj` one each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum LoraTarget {
    /// Llama's query projection.
    QProj,
    /// Llama's key projection.
    KProj,
    /// Llama's value projection.
    VProj,
    /// Llama's attention output projection.
    OProj,
    /// Llama's MLP gate projection.
    GateProj,
    /// Llama's MLP up projection.
    UpProj,
    /// Llama's MLP down projection.
    DownProj,
    /// GPT-2's fused query/key/value projection.
    CAttn,
    /// GPT-2's MLP input projection.
    CFc,
    /// Both of GPT-2's `c_proj` (attention output and MLP output).
    CProj,
    /// GPT-2's attention output projection only.
    AttnCProj,
    /// GPT-2's MLP output projection only.
    MlpCProj,
}

impl LoraTarget {
    const ALL: [LoraTarget; 12] = [
        Self::QProj,
        Self::KProj,
        Self::VProj,
        Self::OProj,
        Self::GateProj,
        Self::UpProj,
        Self::DownProj,
        Self::CAttn,
        Self::CFc,
        Self::CProj,
        Self::AttnCProj,
        Self::MlpCProj,
    ];
    /// Every target's name, in [`LoraTarget::name`]'s spelling.
    pub const NAMES: [&'static str; 12] = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "c_attn",
        "c_fc",
        "c_proj",
        "attn.c_proj",
        "mlp.c_proj",
    ];

    /// The name as PEFT's `target_modules` writes it.
    pub fn name(&self) -> &'static str {
        let i = Self::ALL.iter().position(|t| t == self).expect("listed");
        Self::NAMES[i]
    }

    /// Whether the target names the module at Hugging Face path `path`
    /// (PEFT's rule: the whole path, or its tail after a dot).
    pub fn matches(&self, path: &str) -> bool {
        let name = self.name();
        path == name
            || path
                .strip_suffix(name)
                .is_some_and(|head| head.ends_with('.'))
    }
}

impl FromStr for LoraTarget {
    type Err = LoraError;
    fn from_str(s: &str) -> Result<Self, LoraError> {
        Self::NAMES
            .iter()
            .position(|n| *n == s)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| LoraError::UnknownTarget(s.to_string()))
    }
}

impl TryFrom<String> for LoraTarget {
    type Error = LoraError;
    fn try_from(s: String) -> Result<Self, LoraError> {
        s.parse()
    }
}

impl From<LoraTarget> for String {
    fn from(t: LoraTarget) -> String {
        t.name().to_string()
    }
}

impl fmt::Display for LoraTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What adapters to add and how they scale (PEFT's `LoraConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Rank `r` of each update.
    pub rank: usize,
    /// `lora_alpha`: the update is scaled by `alpha / rank` (or
    /// `alpha / √rank` with `rslora`).
    pub alpha: f64,
    /// Dropout on the adapter's input while training (0: none).
    pub dropout: f64,
    /// The projections that get an adapter.
    pub targets: Vec<LoraTarget>,
    /// Rank-stabilised scaling `alpha / √rank` (PEFT's `use_rslora`).
    #[serde(default)]
    pub rslora: bool,
    /// Leave the token embeddings and the LM head trainable too.
    #[serde(default)]
    pub train_embeddings: bool,
}

impl LoraConfig {
    /// Rank `rank`, `alpha`, no dropout, the given targets.
    pub fn new(rank: usize, alpha: f64, targets: Vec<LoraTarget>) -> Self {
        Self {
            rank,
            alpha,
            dropout: 0.0,
            targets,
            rslora: false,
            train_embeddings: false,
        }
    }

    /// The factor on `B·A`.
    pub fn scale(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    /// Rank positive, alpha finite, dropout in `[0, 1)`, some target.
    pub fn validate(&self) -> Result<(), LoraError> {
        let invalid = |s: &str| Err(LoraError::Invalid(s.to_string()));
        if self.rank == 0 {
            return invalid("rank must be positive");
        }
        if !self.alpha.is_finite() {
            return invalid("alpha must be finite");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return invalid("dropout must be in [0, 1)");
        }
        if self.targets.is_empty() {
            return invalid("no target modules");
        }
        Ok(())
    }
}

/// One adapter: `forward(x) = (dropout(x) · Aᵀ) · Bᵀ · scale`, with A and
/// B in PEFT's layout (and so written to its files as they are).
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    /// `lora_A`, `[rank, in]`.
    pub lora_a: Param<Tensor<B, 2>>,
    /// `lora_B`, `[out, rank]`.
    pub lora_b: Param<Tensor<B, 2>>,
    /// Only with a positive dropout: burn's `Dropout` draws a mask even at 0.
    pub dropout: Option<Dropout>,
    /// `alpha / rank` or `alpha / √rank` ([`LoraConfig::scale`]).
    #[module(skip)]
    pub scale: f64,
}

impl<B: Backend> Lora<B> {
    /// An adapter from `d_in` to `d_out` initialised as PEFT does: A
    /// Kaiming-uniform with `a = √5`, which for a `[rank, in]` matrix is
    /// `U(-1/√in, 1/√in)`; B zero, so the model starts unchanged.
    pub fn new(d_in: usize, d_out: usize, config: &LoraConfig, device: &B::Device) -> Self {
        let bound = 1.0 / (d_in as f64).sqrt();
        let a = Tensor::random(
            [config.rank, d_in],
            Distribution::Uniform(-bound, bound),
            device,
        );
        Self {
            lora_a: Param::from_tensor(a),
            lora_b: Param::from_tensor(Tensor::zeros([d_out, config.rank], device)),
            dropout: (config.dropout > 0.0).then(|| DropoutConfig::new(config.dropout).init()),
            scale: config.scale(),
        }
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.lora_a.dims()[0]
    }

    /// The update for `x: [batch, seq, in]`, `[batch, seq, out]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = match &self.dropout {
            Some(dropout) => dropout.forward(x),
            None => x,
        };
        let low = linear_tokens(x, self.lora_a.val().transpose(), None);
        linear_tokens(low, self.lora_b.val().transpose(), None) * self.scale
    }

    /// `scale · (B·A)ᵀ`, `[in, out]`: the update in burn's `Linear` layout.
    pub fn delta(&self) -> Tensor<B, 2> {
        self.lora_a
            .val()
            .transpose()
            .matmul(self.lora_b.val().transpose())
            * self.scale
    }
}

/// `layer(x)` plus the adapter's update where there is one.
pub fn forward_lora<B: Backend>(
    layer: &Linear<B>,
    lora: &Option<Lora<B>>,
    x: Tensor<B, 3>,
) -> Tensor<B, 3> {
    match lora {
        Some(lora) => forward_tokens(layer, x.clone()) + lora.forward(x),
        None => forward_tokens(layer, x),
    }
}

/// A projection that can carry an adapter, with its Hugging Face module
/// path (`model.layers.0.self_attn.q_proj`); `L` and `A` are shared or
/// mutable references to the projection and its adapter.
pub struct Slot<L, A> {
    /// Hugging Face module path, without PEFT's `base_model.model.`.
    pub path: String,
    /// The projection.
    pub base: L,
    /// Its adapter.
    pub lora: A,
}

/// A slot read.
pub type SlotRef<'a, B> = Slot<&'a Linear<B>, &'a Option<Lora<B>>>;
/// A slot changed.
pub type SlotMut<'a, B> = Slot<&'a mut Linear<B>, &'a mut Option<Lora<B>>>;

/// One adapter parameter: its module path (`layers.0.attn.q_lora.lora_a`)
/// and id, for an optimizer or a report.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterParam {
    /// Module path.
    pub path: String,
    /// Parameter id.
    pub id: ParamId,
    /// Shape.
    pub shape: Vec<usize>,
}

/// A model whose projections can carry LoRA adapters.
pub trait LoraModel<B: Backend>: Module<B> + Sized {
    /// The model's kind, for messages.
    const KIND: &'static str;
    /// PEFT's `fan_in_fan_out`: the Hugging Face checkpoint stores the
    /// projections as `Conv1D` (`[in, out]`, GPT-2) rather than `nn.Linear`.
    const FAN_IN_FAN_OUT: bool;
    /// Top-level modules that `train_embeddings` leaves trainable.
    const EMBEDDINGS: &'static [&'static str];

    /// Every projection that can carry an adapter, in module order.
    fn slots(&self) -> Vec<SlotRef<'_, B>>;
    /// [`LoraModel::slots`], to change.
    fn slots_mut(&mut self) -> Vec<SlotMut<'_, B>>;

    /// The model with an adapter on each projection `config` targets and
    /// every other parameter frozen (`require_grad` false; embeddings and
    /// head excepted with `train_embeddings`). Fails on a bad config, a
    /// target naming no projection of this model, or existing adapters.
    fn with_lora(self, config: &LoraConfig, device: &B::Device) -> Result<Self, LoraError> {
        config.validate()?;
        if self.slots().iter().any(|s| s.lora.is_some()) {
            return Err(LoraError::AlreadyAdapted);
        }
        for target in &config.targets {
            if !self.slots().iter().any(|s| target.matches(&s.path)) {
                return Err(LoraError::UnsupportedTarget {
                    target: target.name().into(),
                    model: Self::KIND,
                });
            }
        }
        // Freeze before adding: the adapters are then the only parameters
        // created trainable. The model has none yet, so `frozen_ids` names
        // every parameter but those `train_embeddings` keeps.
        let frozen = self.frozen_ids(config);
        let mut model = self.map(&mut Freeze { frozen: &frozen });
        for slot in model.slots_mut() {
            if config.targets.iter().any(|t| t.matches(&slot.path)) {
                let [d_in, d_out] = slot.base.weight.lazy_shape().dims::<2>();
                *slot.lora = Some(Lora::new(d_in, d_out, config, device));
            }
        }
        Ok(model)
    }

    /// The model with each adapter folded into its projection (`W + scale·B·A`
    /// in burn's `[in, out]` layout) and removed: the parameter list of the
    /// model before [`LoraModel::with_lora`]. Projections keep their ids
    /// and their frozen state.
    fn merge_lora(mut self) -> Self {
        for slot in self.slots_mut() {
            if let Some(lora) = slot.lora.take() {
                let delta = lora.delta();
                slot.base.weight = slot.base.weight.clone().map(|w| {
                    let trainable = w.is_require_grad();
                    // Detached: the merged weight is a leaf, not a function
                    // of the adapter it absorbed.
                    (w + delta).detach().set_require_grad(trainable)
                });
            }
        }
        self
    }

    /// The ids of the parameters [`LoraModel::with_lora`] freezes under
    /// `config`: every one outside the adapters (the embeddings and head
    /// excepted with `train_embeddings`). Read from module paths, so it holds
    /// on any backend: only an autodiff backend keeps `require_grad`.
    fn frozen_ids(&self, config: &LoraConfig) -> HashSet<ParamId> {
        let keep: &[&str] = if config.train_embeddings {
            Self::EMBEDDINGS
        } else {
            &[]
        };
        let mut visitor = Frozen {
            keep,
            path: Vec::new(),
            out: HashSet::new(),
        };
        self.visit(&mut visitor);
        visitor.out
    }

    /// Every adapter parameter, in module order.
    fn adapter_params(&self) -> Vec<AdapterParam> {
        let mut visitor = Adapters {
            path: Vec::new(),
            out: Vec::new(),
        };
        self.visit(&mut visitor);
        visitor.out
    }
}

/// Sets `require_grad` false on the parameters in `frozen` and true on
/// the others, without initialising lazy ones.
struct Freeze<'a> {
    frozen: &'a HashSet<ParamId>,
}

impl<B: Backend> ModuleMapper<B> for Freeze<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let trainable = !self.frozen.contains(&param.id);
        param.set_require_grad(trainable)
    }
}

/// Whether a module path lies inside an adapter (a `*_lora` module).
fn in_adapter(path: &[String]) -> bool {
    path.iter().any(|p| p.ends_with("_lora"))
}

/// Collects the ids of the parameters outside the adapters and `keep`.
struct Frozen<'a> {
    keep: &'a [&'a str],
    path: Vec<String>,
    out: HashSet<ParamId>,
}

impl<B: Backend> ModuleVisitor<B> for Frozen<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let kept = self
            .path
            .first()
            .is_some_and(|top| self.keep.contains(&top.as_str()));
        if !kept && !in_adapter(&self.path) {
            self.out.insert(param.id);
        }
    }
}

/// Collects the parameters inside a `*_lora` module.
struct Adapters {
    path: Vec<String>,
    out: Vec<AdapterParam>,
}

impl<B: Backend> ModuleVisitor<B> for Adapters {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if in_adapter(&self.path) {
            self.out.push(AdapterParam {
                path: self.path.join("."),
                id: param.id,
                shape: param.lazy_shape().to_vec(),
            });
        }
    }
}
