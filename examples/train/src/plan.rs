//! The memory planner: the host and device bytes a training job will need,
//! predicted from the model config and batch shape before anything is
//! allocated, checked against what the machine has.
//!
//! Host figures are exact for the store (fp32 weights, Adam m and v, and the
//! gradient buffer unless fused) and close for the engine's own buffers.
//! Device figures are estimates: one Llama/GPT-2 block's activations under
//! autodiff are counted tensor by tensor (docs/ARCHITECTURE.md §6) with a margin for the
//! backward's temporaries, plus a fixed allowance for the CUDA context and
//! the allocator's pools. The block backward and the LM head are phases that
//! never hold memory at the same time: the larger of the two counts. On a GPU
//! cubecl reserves whole pages, one of each size class once any is used, so
//! the peak is never below that floor (measured on the H100: 6.6 GiB of pool
//! for a 7.6 GiB process; bench/results/cuda-bench).

use std::fmt::Write as _;

use burn_offload::ops::attention;
use burn_offload::Compute;
use models::ModelConfig;

const GIB: f64 = (1u64 << 30) as f64;
const F32: u64 = 4;

/// What the job is.
#[derive(Debug, Clone)]
pub struct Job {
    pub config: ModelConfig,
    pub batch: usize,
    pub seq_len: usize,
    /// Micro-batches per step on each device (activations are those of one).
    pub accum: usize,
    /// Devices trained on, data parallel: each holds the device items below
    /// (the plan's device figures are per device), the host the store once
    /// and each device's block inputs.
    pub gpus: usize,
    pub fused: bool,
    pub resident: bool,
    /// With `resident`: the model on `Offload<B>` with the host optimizer
    /// (weights and Adam state in host memory, gradients on the device until
    /// the step, weights paged in through a cache).
    pub host_params: bool,
    /// Device compute precision: sets the bytes of weights on the device,
    /// activations and checkpoints (the loss stays f32).
    pub compute: Compute,
    pub loss_chunk_tokens: usize,
    /// Whether the device is a GPU (its context and pools cost memory).
    pub gpu: bool,
    /// Where the engine keeps the block-input checkpoints on a GPU.
    pub block_inputs: BlockInputs,
    /// How many of the last blocks keep their forward graph (no recompute).
    pub kept_graphs: KeptGraphs,
    /// How many recomputed blocks (the last ones) keep their attention
    /// outputs from the forward (`EngineConfig::kept_attention`); decided
    /// by [`Job::place_kept_attention`].
    pub kept_attention: usize,
    /// How the host holds the gradients and the weights for upload.
    pub host_layout: HostLayout,
    /// The optimizer's moments: fp32 or 8-bit.
    pub optim_state: OptimState,
    /// Blocks whose gradients may wait on the device for the host worker
    /// (`EngineConfig::gradient_blocks_in_flight`).
    pub gradient_blocks_in_flight: usize,
    /// The blocks' MLP over tiles of this many tokens
    /// (`burn_offload::ops::mlp`), where the plan needs it.
    pub mlp_tile: Option<usize>,
    /// With `host_params`: the device copies of parameters kept cached.
    pub param_cache: ParamCache,
}

/// How many bytes of device copies of host-resident parameters the type
/// parameter's page cache keeps (`burn_offload::residency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamCache {
    /// Every parameter's when the plan fits the GPU with them (the backward
    /// then reads the copies the forward paged in), else the default.
    Auto,
    /// This many bytes.
    Bytes(u64),
}

impl ParamCache {
    /// The cache's budget when nothing else decides it.
    pub const DEFAULT: u64 = burn_offload::residency::DEFAULT_PARAM_CACHE_BYTES;

    /// The cache's budget in bytes ([`ParamCache::DEFAULT`] for `Auto`).
    pub fn bytes(self) -> u64 {
        match self {
            ParamCache::Auto => Self::DEFAULT,
            ParamCache::Bytes(bytes) => bytes,
        }
    }
}

/// The most blocks whose gradients may wait on the device for the host
/// worker: slack for a worker that falls behind for a moment.
/// [`Job::place_gradient_blocks`] lowers it to what the GPU has room for.
pub const GRADIENT_BLOCKS_IN_FLIGHT: usize = 4;

/// How the engine keeps the optimizer's moments in host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OptimState {
    /// fp32, 8 B/param for both.
    #[default]
    Fp32,
    /// 8-bit blockwise (bitsandbytes' scheme): a byte per value and a
    /// scale per 256 values, about 2 B/param for both.
    EightBit,
}

impl OptimState {
    /// Host bytes of both moments for `params` parameters.
    pub fn bytes(self, params: u64) -> u64 {
        match self {
            OptimState::Fp32 => 2 * F32 * params,
            OptimState::EightBit => {
                let block = burn_offload::QUANT_BLOCK as u64;
                2 * (params + F32 * params.div_ceil(block))
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OptimState::Fp32 => "fp32",
            OptimState::EightBit => "8bit",
        }
    }
}

impl std::fmt::Display for OptimState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for OptimState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [OptimState::Fp32, OptimState::EightBit]
            .into_iter()
            .find(|o| o.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("expected fp32 or 8bit, got `{s}`"))
    }
}

/// How the engine's host store holds what a compute precision below fp32
/// needs beside the fp32 weights and Adam state (at fp32 there is one layout).
/// Neither changes what clipping and the guard see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostLayout {
    /// Compact where it applies and the full layout does not fit the host,
    /// full otherwise.
    Auto,
    /// A copy of the weights in the compute precision for upload, and an
    /// fp32 gradient buffer (18 host B/param in bf16; fused 14).
    Full,
    /// The fp32 weights uploaded and cast on the device, and, with one
    /// micro-batch per step, the blocks' gradients kept as they arrive, in
    /// the compute precision (14 host B/param in bf16; 16 with `--accum`;
    /// fused 12).
    Compact,
}

impl HostLayout {
    pub const ALL: [HostLayout; 3] = [HostLayout::Auto, HostLayout::Full, HostLayout::Compact];

    pub fn name(self) -> &'static str {
        match self {
            HostLayout::Auto => "auto",
            HostLayout::Full => "full",
            HostLayout::Compact => "compact",
        }
    }
}

impl std::fmt::Display for HostLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for HostLayout {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostLayout::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("expected auto, full or compact, got `{s}`"))
    }
}

/// How many blocks, counted back from the last, the engine runs forward under
/// `Autodiff` and keeps on the device until the backward instead of
/// recomputing them (`EngineConfig::kept_graphs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptGraphs {
    /// On a GPU, as many as the plan fits in 90% of the free memory left
    /// after everything else; none on CPU backends, whose device is the host.
    Auto,
    Count(usize),
}

impl KeptGraphs {
    /// The number, once decided (`Auto` counts as none).
    pub fn count(self) -> usize {
        match self {
            KeptGraphs::Auto => 0,
            KeptGraphs::Count(n) => n,
        }
    }
}

impl std::fmt::Display for KeptGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeptGraphs::Auto => f.write_str("auto"),
            KeptGraphs::Count(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for KeptGraphs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(KeptGraphs::Auto);
        }
        s.parse()
            .map(KeptGraphs::Count)
            .map_err(|_| format!("expected `auto` or a number of blocks, got `{s}`"))
    }
}

/// Where the offload engine keeps the block inputs it recomputes from (one
/// `tokens × d_model` tensor per block) on a GPU. On the device they cost no
/// copies and no host round trip; in host memory the device stays flat in
/// depth. On CPU backends the device is the host and this has no effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockInputs {
    /// On the device when the plan fits the GPU with them there, else in host memory.
    Auto,
    Host,
    Device,
}

impl BlockInputs {
    pub const ALL: [BlockInputs; 3] = [BlockInputs::Auto, BlockInputs::Host, BlockInputs::Device];

    pub fn name(self) -> &'static str {
        match self {
            BlockInputs::Auto => "auto",
            BlockInputs::Host => "host",
            BlockInputs::Device => "device",
        }
    }
}

impl std::fmt::Display for BlockInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BlockInputs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BlockInputs::ALL
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "unknown block-input placement `{s}`; expected one of: {}",
                    BlockInputs::ALL.map(BlockInputs::name).join(", ")
                )
            })
    }
}

impl Job {
    /// Whether the compact host layout can apply to this job: the engine,
    /// a compute precision below fp32.
    pub fn compact_applies(&self) -> bool {
        !self.resident && self.compute != Compute::Fp32
    }

    /// Whether the job runs with the compact host layout (once placed).
    pub fn compact(&self) -> bool {
        self.host_layout == HostLayout::Compact
    }

    /// Whether the blocks' gradient buffer is in the compute precision: the
    /// compact layout with a buffer and one micro-batch.
    pub fn compact_gradients(&self) -> bool {
        self.compact() && !self.fused && self.accum == 1
    }

    /// The job with [`HostLayout::Auto`] decided for `machine` (call it
    /// first): compact where it applies and the full layout does not fit,
    /// with the block inputs placed either way; full otherwise.
    pub fn place_host_layout(mut self, machine: &Machine) -> Self {
        if self.host_layout != HostLayout::Auto {
            return self;
        }
        self.host_layout = HostLayout::Full;
        if self.compact_applies() {
            let full = self.clone().place_block_inputs(machine);
            if Plan::new(&full).check(&full, machine).is_err() {
                self.host_layout = HostLayout::Compact;
            }
        }
        self
    }

    /// The store's mode in words, with its host bytes per parameter and
    /// whether clipping and the guard need one backward or two.
    pub fn store_mode(&self) -> String {
        if self.resident {
            return "resident (plain burn)".into();
        }
        let layout = if self.compact() { "compact" } else { "full" };
        let mode = if self.fused { "fused" } else { "buffered" };
        let exact = if self.fused {
            "clipping or the guard run the backward twice"
        } else {
            "exact clipping and guard with one backward"
        };
        format!(
            "{mode}, host layout {layout}, {} Adam state: {} B/param in the store ({exact})",
            self.optim_state,
            self.store_bytes_per_param()
        )
    }

    /// Host bytes per parameter of the engine's store in this job's mode.
    pub fn store_bytes_per_param(&self) -> u64 {
        let copy = if self.compute != Compute::Fp32 && !self.compact() {
            2
        } else {
            0
        };
        let gradients = match (self.fused, self.compact_gradients()) {
            (true, _) => 0,
            (false, true) => 2,
            (false, false) => 4,
        };
        let moments = match self.optim_state {
            OptimState::Fp32 => 8,
            OptimState::EightBit => 2,
        };
        4 + moments + copy + gradients
    }

    /// The job with [`BlockInputs::Auto`] decided for `machine`: on a GPU the
    /// block inputs go to the device when the whole plan still fits it, else
    /// to host memory; on CPU backends the device is the host.
    pub fn place_block_inputs(mut self, machine: &Machine) -> Self {
        if self.block_inputs == BlockInputs::Auto {
            self.block_inputs = BlockInputs::Device;
            if self.gpu && Plan::new(&self).check(&self, machine).is_err() {
                self.block_inputs = BlockInputs::Host;
            }
        }
        self
    }

    /// The job with the blocks' MLP over tiles of
    /// [`burn_offload::ops::mlp::MLP_TILE_TOKENS`] where the engine's plan
    /// does not fit the GPU without (call it after
    /// [`Job::place_block_inputs`]): the tiles keep none of the MLP's
    /// `[tokens, d_ff]` values for the backward, at the price of its two
    /// projections again. Models whose MLP has biases, or whose micro-batch
    /// is one tile, run it plain.
    pub fn place_mlp_tile(mut self, machine: &Machine) -> Self {
        let tile = burn_offload::ops::mlp::MLP_TILE_TOKENS;
        let tokens = self.batch * self.seq_len;
        if self.mlp_tile.is_some()
            || !self.gpu
            || self.resident
            || tokens <= tile
            || shape(&self.config).mlp_per_token == 0
            || Plan::new(&self).fits_device(machine)
        {
            return self;
        }
        self.mlp_tile = Some(tile);
        self
    }

    /// The job with [`ParamCache::Auto`] decided for `machine`: with
    /// `--host-params` on a GPU, every parameter's device copy (f32) when the
    /// plan fits the GPU with them, else [`ParamCache::DEFAULT`].
    pub fn place_param_cache(mut self, machine: &Machine) -> Self {
        if self.param_cache != ParamCache::Auto {
            return self;
        }
        self.param_cache = ParamCache::Bytes(ParamCache::DEFAULT);
        if self.gpu && self.resident && self.host_params {
            let all = Job {
                param_cache: ParamCache::Bytes(F32 * self.config.num_params() as u64),
                ..self.clone()
            };
            if all.param_cache.bytes() > ParamCache::DEFAULT && Plan::new(&all).fits_device(machine)
            {
                return all;
            }
        }
        self
    }

    /// The job with as many blocks' gradients waiting on the device (at most
    /// the job's, at least one) as fit `machine`'s GPU (call it after
    /// [`Job::place_block_inputs`]). Under a tight budget one block's: the
    /// backward then waits for the host worker instead of holding more.
    pub fn place_gradient_blocks(mut self, machine: &Machine) -> Self {
        if !self.gpu || self.resident {
            return self;
        }
        while self.gradient_blocks_in_flight > 1 && !Plan::new(&self).fits_device(machine) {
            self.gradient_blocks_in_flight -= 1;
        }
        self.gradient_blocks_in_flight = self.gradient_blocks_in_flight.max(1);
        self
    }

    /// The job with every choice the plan makes for `machine` made, in
    /// order. Where the recomputed blocks' attention outputs do not all fit,
    /// the block inputs in host memory and the MLP over tiles (each where
    /// the job leaves it to the plan) are tried too, and the fitting choice
    /// that keeps the most outputs is taken: a sequence that long spends
    /// most of a block's recompute in attention's forward, which grows with
    /// the square of its tokens, while the copies of host-held block inputs
    /// overlap the compute and the tiles' second projections grow only with
    /// the tokens.
    pub fn placed(self, machine: &Machine) -> Self {
        let chain = |job: Job| {
            job.place_param_cache(machine)
                .place_host_layout(machine)
                .place_block_inputs(machine)
                .place_mlp_tile(machine)
                .place_gradient_blocks(machine)
                .place_kept_attention(machine)
                .place_kept_graphs(machine)
        };
        let first = chain(self.clone());
        let layers = shape(&self.config).layers as usize;
        if first.kept_attention >= layers - first.kept_graphs.count().min(layers) {
            return first;
        }
        let tile = burn_offload::ops::mlp::MLP_TILE_TOKENS;
        let can_tile = self.mlp_tile.is_none()
            && shape(&self.config).mlp_per_token > 0
            && self.batch * self.seq_len > tile;
        let mut best = first;
        for (host_inputs, tiles) in [(true, false), (false, true), (true, true)] {
            if (host_inputs && self.block_inputs != BlockInputs::Auto) || (tiles && !can_tile) {
                continue;
            }
            let mut job = self.clone();
            if host_inputs {
                job.block_inputs = BlockInputs::Host;
            }
            if tiles {
                job.mlp_tile = Some(tile);
            }
            let job = chain(job);
            if job.kept_attention > best.kept_attention
                && Plan::new(&job).check(&job, machine).is_ok()
            {
                best = job;
            }
        }
        best
    }

    /// The job with the attention outputs of as many recomputed blocks kept
    /// from the forward as fit in 90% of the GPU beside the rest of the plan
    /// (call it after [`Job::place_gradient_blocks`], before
    /// [`Job::place_kept_graphs`], which then fills what room is left): past
    /// ~100k tokens a sequence attention's forward is most of a block's
    /// recompute, and its output costs a fraction of a kept graph. Resident
    /// jobs and CPU backends keep none.
    pub fn place_kept_attention(mut self, machine: &Machine) -> Self {
        self.kept_attention = 0;
        let (Some(gpu), true, false) = (machine.device_bytes, self.gpu, self.resident) else {
            return self;
        };
        let layers = shape(&self.config).layers as usize;
        let recomputed = layers - self.kept_graphs.count().min(layers);
        let per_block = kept_attention_bytes(&self).max(1);
        let rest = Plan::new(&self).device_peak(machine);
        let room = (gpu as f64 * 0.9) as u64;
        let fit = (room.saturating_sub(rest) / per_block) as usize;
        self.kept_attention = fit.min(recomputed);
        self
    }

    /// The job with [`KeptGraphs::Auto`] decided for `machine` (call it after
    /// [`Job::place_gradient_blocks`]): on a GPU, as many blocks as fit in 90% of
    /// the free memory the rest of the plan leaves (the free memory measured
    /// at start; the margin is for the allocator's fragmentation). Resident
    /// jobs and CPU backends keep none.
    pub fn place_kept_graphs(mut self, machine: &Machine) -> Self {
        if self.kept_graphs != KeptGraphs::Auto {
            return self;
        }
        self.kept_graphs = KeptGraphs::Count(0);
        let (Some(gpu), true, false) = (machine.device_bytes, self.gpu, self.resident) else {
            return self;
        };
        let per_block = kept_graph_bytes(&self).max(1);
        let rest = Plan::new(&self).device_peak(machine);
        let room = (gpu as f64 * 0.9) as u64;
        let layers = shape(&self.config).layers as usize;
        let fit = (room.saturating_sub(rest) / per_block) as usize;
        self.kept_graphs = KeptGraphs::Count(fit.min(layers));
        // Blocks whose graphs are kept are not recomputed: no outputs kept for them.
        self.kept_attention = self.kept_attention.min(layers - fit.min(layers));
        self
    }
}

/// Device bytes one kept block graph holds through the step: the block's
/// weights (bound until its backward) and the values its backward reads,
/// none of the backward's own temporaries. Attention keeps no `[b, h, t, t]`
/// tensor (`burn_offload::ops::attention`). On the H100 a kept block cost 0.88 of
/// this estimate (0.85B fp32 at 16k tokens, 15 blocks kept at 54,751 MiB
/// against 11,423 with none), so the estimate also covers the
/// pools' page rounding; a GPU filled to the last page by kept graphs would
/// fail mid-step. (With the earlier attention, which kept the weights, a
/// kept block measured 1.04–1.23 times its values.)
pub fn kept_graph_bytes(job: &Job) -> u64 {
    let s = shape(&job.config);
    let (b, t) = (job.batch as u64, job.seq_len as u64);
    let width = job.compute.bytes() as u64;
    width * (s.block_params + b * t * s.saved_per_token(job.mlp_tile))
}

/// Device bytes one recomputed block's kept attention output holds until
/// its backward: the output (`[tokens, query width]` in the compute
/// precision) and an f32 log-sum-exp per token and query head.
pub fn kept_attention_bytes(job: &Job) -> u64 {
    let s = shape(&job.config);
    let tokens = (job.batch * job.seq_len) as u64;
    tokens * (job.compute.bytes() as u64 * s.d + F32 * s.heads)
}

/// What the machine has, and where each figure came from.
#[derive(Debug, Clone)]
pub struct Machine {
    pub host_bytes: u64,
    pub host_source: String,
    /// `None`: the device is the host (CPU backends).
    pub device_bytes: Option<u64>,
    pub device_source: String,
}

/// One line of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub what: &'static str,
    pub bytes: u64,
    /// A phase's working memory: of these, only the largest counts.
    pub phase: bool,
}

impl Item {
    fn held(what: &'static str, bytes: u64) -> Self {
        Self {
            what,
            bytes,
            phase: false,
        }
    }

    fn phase(what: &'static str, bytes: u64) -> Self {
        Self {
            what,
            bytes,
            phase: true,
        }
    }
}

const CONTEXT: &str = "CUDA context and allocator pools";

/// The share of a GPU's memory that cubecl's pools reserve as soon as each
/// page class is used once (pages of 1/16, 1/64, 1/256, ... of the device).
const POOL_FLOOR_FRACTION: f64 = 1.0 / 16.0 + 1.0 / 64.0 + 1.0 / 256.0 + 1.0 / 1024.0;

/// Predicted memory of a job.
#[derive(Debug, Clone)]
pub struct Plan {
    pub host: Vec<Item>,
    pub device: Vec<Item>,
    /// Parameters, for bytes/param.
    pub params: u64,
    /// Devices the job trains on: each holds `device`.
    pub devices: u64,
}

/// Shape facts the estimate needs, for either architecture.
pub(crate) struct Shape {
    pub(crate) vocab: u64,
    pub(crate) d: u64,
    pub(crate) layers: u64,
    pub(crate) heads: u64,
    /// Width of the keys (and of the values).
    pub(crate) kv: u64,
    pub(crate) block_params: u64,
    pub(crate) stem_params: u64,
    pub(crate) largest_tensor: u64,
    /// Values a block keeps for its backward, per token (attention keeps no
    /// `[seq, seq]` scores: see `burn_offload::ops::attention`).
    pub(crate) saved_per_token: u64,
    /// Of those, the MLP's intermediate values, which an MLP over tiles of
    /// tokens does not keep; 0 where the MLP cannot be tiled.
    pub(crate) mlp_per_token: u64,
    /// The MLP's hidden width.
    pub(crate) ff: u64,
}

impl Shape {
    /// Values a block keeps for its backward per token, with the MLP over
    /// tiles or not.
    fn saved_per_token(&self, mlp_tile: Option<usize>) -> u64 {
        match mlp_tile {
            Some(_) => self.saved_per_token - self.mlp_per_token,
            None => self.saved_per_token,
        }
    }
}

pub(crate) fn shape(config: &ModelConfig) -> Shape {
    match config {
        ModelConfig::Llama(c) => {
            let (d, kv) = (c.d_model as u64, (c.n_kv_head * c.head_dim()) as u64);
            let ff = c.d_ff as u64;
            let block_params = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * ff;
            let vocab = c.vocab_size as u64;
            Shape {
                vocab,
                d,
                layers: c.n_layer as u64,
                heads: c.n_head as u64,
                kv,
                block_params,
                stem_params: 2 * vocab * d + d,
                largest_tensor: (vocab * d).max(ff * d),
                // The block input and the first norm 3d; attention's q, k,
                // v, output and log-sum-exp d+2kv+d+heads; the o-proj input
                // d; the residual and second norm 3d; SwiGLU 5ff (gate, its
                // sigmoid, silu, up, their product).
                saved_per_token: 3 * d + (2 * d + 2 * kv + c.n_head as u64) + d + 3 * d + 5 * ff,
                mlp_per_token: if c.mlp_bias { 0 } else { 5 * ff },
                ff,
            }
        }
        ModelConfig::Gpt2(c) => {
            let d = c.d_model as u64;
            let vocab = c.vocab_size as u64;
            Shape {
                vocab,
                d,
                layers: c.n_layer as u64,
                heads: c.n_head as u64,
                kv: d,
                block_params: 12 * d * d + 13 * d,
                stem_params: vocab * d + c.n_ctx as u64 * d + 2 * d,
                largest_tensor: vocab * d,
                // LayerNorms 2×3d, qkv 3d, attention out, proj and residuals 4d, GELU MLP 3×4d.
                saved_per_token: 6 * d + 3 * d + 4 * d + 12 * d,
                mlp_per_token: 0,
                ff: 4 * d,
            }
        }
    }
}

impl Plan {
    pub fn new(job: &Job) -> Self {
        let s = shape(&job.config);
        let params = job.config.num_params() as u64;
        let tokens = (job.batch * job.seq_len) as u64;
        let (b, t) = (job.batch as u64, job.seq_len as u64);
        // Bytes of one device value (weights, activations, checkpoints).
        let width = job.compute.bytes() as u64;
        // Attention's score-sized temporaries (scores, probabilities and
        // their gradients), one query block and key tile of one chunk of
        // sequences at a time, and the f32 sums of the tiles' outputs and
        // gradients (queries, keys, values) where a sequence has several.
        let (heads, seq) = (s.heads as usize, t as usize);
        let tiling = attention::Tiling::new(heads, seq);
        let mut scores = width * 4 * tiling.score_elements(b as usize, heads, seq) as u64;
        if tiling.tiles_keys(seq) {
            scores += F32 * tokens * (2 * s.d + 2 * s.kv);
        }
        // cuDNN's fused attention, where it runs instead, needs far less.
        let head_dim = (s.d / s.heads.max(1)) as usize;
        let cudnn = attention::cudnn_scratch_bytes(b as usize, heads, seq, head_dim) as u64;
        let scores = scores.max(cudnn);
        let block_saved = width * tokens * s.saved_per_token(job.mlp_tile);
        // An MLP over tiles holds one tile's six `[tile, ff]` values in its
        // backward (the projections recomputed, the gate, their gradients)
        // and the f32 sums of the three weights' gradients.
        let mlp_tile = match job.mlp_tile {
            Some(tile) => width * 6 * (tile as u64).min(tokens) * s.ff + F32 * 3 * s.d * s.ff,
            None => 0,
        };
        // Beside the saved values, a block's backward holds their gradients
        // and its temporaries: 1.25 times the saved values (the whole
        // recompute + backward at 2.25 times fits the H100 peaks of the
        // 0.85B at 4k and 16k tokens).
        let backward_temporaries = block_saved * 5 / 4 + scores + mlp_tile;
        let block_backward = block_saved + backward_temporaries;
        let chunk = (job.loss_chunk_tokens as u64).clamp(1, tokens);
        // Logits, log-softmax (and its max/exp/sum), their gradient.
        let loss_chunk = F32 * 5 * chunk * s.vocab;
        let runtime_device = if job.gpu { (1.0 * GIB) as u64 } else { 0 };

        let mut host = vec![
            Item::held("parameters (fp32 master weights)", F32 * params),
            Item::held(
                if job.optim_state == OptimState::EightBit {
                    "Adam m and v (8-bit, a scale per 256)"
                } else {
                    "Adam m and v (fp32)"
                },
                job.optim_state.bytes(params),
            ),
        ];
        let mut device = Vec::new();
        if job.resident && job.host_params {
            device.push(Item::held(
                "gradients (every parameter's, until the step)",
                F32 * params,
            ));
            // The H100 runs of the 0.85B grew by about twice the cache's
            // bytes when it grew: the next step's page-ins arrive while the
            // updated parameters' old copies are still cached.
            device.push(Item::held(
                "parameter cache (weights paged in, and the next step's)",
                2 * job.param_cache.bytes(),
            ));
        } else if job.resident {
            device.push(Item::held(
                "parameters, gradients, Adam m and v",
                4 * F32 * params,
            ));
        }
        if job.resident {
            if job.accum > 1 {
                device.push(Item::held(
                    "gradients summed over the micro-batches",
                    F32 * params,
                ));
            }
            if job.compute != Compute::Fp32 {
                device.push(Item::held(
                    "parameters cast for the forward",
                    width * params,
                ));
            }
            device.push(Item::held(
                "activations of every block (one graph)",
                s.layers * block_saved,
            ));
            device.push(Item::phase(
                "one block's backward temporaries",
                backward_temporaries,
            ));
            device.push(Item::held(
                "logits and loss (whole batch)",
                F32 * 5 * tokens * s.vocab,
            ));
            if job.host_params {
                // `host` already holds the weights and both moments.
                host.push(Item::held(
                    "gradient copies queued for the host optimizer",
                    (F32 * params).min(burn_offload::HOST_GRADIENTS_QUEUED),
                ));
            } else {
                // Resident training keeps its state on the device; the host
                // holds only the initial copy burn makes while building it.
                host = vec![Item::held("parameters while building (fp32)", F32 * params)];
            }
        } else {
            if job.fused {
            } else if job.compact_gradients() {
                let blocks = s.layers * s.block_params;
                host.push(Item::held(
                    "gradient buffer (blocks in the compute precision, stem fp32)",
                    width * blocks + F32 * (params - blocks),
                ));
            } else {
                host.push(Item::held("gradient buffer (fp32)", F32 * params));
            }
            if job.compute != Compute::Fp32 && !job.compact() {
                host.push(Item::held(
                    "weights in the compute precision (uploaded)",
                    width * params,
                ));
            }
            host.push(Item::held(
                "gradients in flight (two blocks and the stem)",
                F32 * (2 * s.block_params + s.stem_params),
            ));
            host.push(Item::held(
                "download staging (largest tensor)",
                F32 * s.largest_tensor,
            ));
            // The embedding phases bind the stem from the f32 weights. On a
            // GPU a dropped block's buffers stay reserved until a later bind
            // has waited for its last kernels (`cuda::UploadPool`).
            let blocks = if job.gpu { 3 } else { 2 };
            // Compact: the blocks arrive in fp32 and two are cast at a time.
            let block_bytes = if job.compact() {
                (F32 * blocks + width * 2) * s.block_params
            } else {
                width * blocks * s.block_params
            };
            device.push(Item::held(
                if job.gpu {
                    "weights: stem + three blocks (bound, copying, retiring)"
                } else {
                    "weights: stem + two blocks"
                },
                F32 * s.stem_params + block_bytes,
            ));
            let checkpoints = width * (s.layers + 1) * tokens * s.d;
            if job.gpu && job.block_inputs == BlockInputs::Host {
                // In host memory the device stays flat in depth; every
                // device keeps its own micro-batch's.
                host.push(Item::held(
                    "block-input checkpoints",
                    job.gpus as u64 * checkpoints,
                ));
                device.push(Item::held(
                    "block input and output in flight",
                    2 * width * tokens * s.d,
                ));
            } else {
                device.push(Item::held("block-input checkpoints", checkpoints));
            }
            if job.gpus > 1 {
                // A block's gradients summed across the devices, beside the
                // device's own, on the device that sends them to the host.
                device.push(Item::held(
                    "a block's gradients summed across the GPUs",
                    width * s.block_params,
                ));
            }
            if !job.fused {
                // The block being handed on, and those the worker is still
                // taking, hold their gradients on the device.
                device.push(Item::held(
                    "block gradients on their way to the host",
                    width * (job.gradient_blocks_in_flight as u64 + 1) * s.block_params,
                ));
            }
            let kept = (job.kept_graphs.count() as u64).min(s.layers);
            if kept > 0 {
                device.push(Item::held(
                    "graphs kept from the forward (not recomputed)",
                    kept * kept_graph_bytes(job),
                ));
            }
            let kept_attention = (job.kept_attention as u64).min(s.layers - kept);
            if kept_attention > 0 {
                device.push(Item::held(
                    "attention outputs kept for the recompute",
                    kept_attention * kept_attention_bytes(job),
                ));
            }
            device.push(Item::phase(
                match job.mlp_tile {
                    Some(_) => "one block's activations (recompute + backward; MLP in tiles)",
                    None => "one block's activations (recompute + backward)",
                },
                block_backward,
            ));
            device.push(Item::phase(
                "LM head + loss chunk",
                loss_chunk + F32 * s.vocab * s.d,
            ));
        }
        if job.gpu {
            device.push(Item::held(CONTEXT, runtime_device));
        }
        if !job.resident {
            // Building the store holds one group's values twice (the stem is the largest).
            host.push(Item::held(
                "while building: one group's values",
                F32 * s.stem_params.max(s.block_params),
            ));
        }
        // Libraries, the token stream, the CUDA driver's host side.
        host.push(Item::held(
            "runtime (libraries, corpus, driver)",
            host_runtime(job.gpu),
        ));
        // A job that fills the host to the last page thrashes the page cache
        // (a 7.4B run at 16 B/param on 125 GiB did not finish a step).
        let used: u64 = host.iter().map(|i| i.bytes).sum();
        host.push(Item::held(
            "headroom for the OS and page cache (8%, >= 1 GiB)",
            (used * 8 / 100).max(MIN_HOST_HEADROOM),
        ));
        Self {
            host,
            device,
            params,
            devices: job.gpus as u64,
        }
    }

    pub fn host_total(&self) -> u64 {
        self.host.iter().map(|i| i.bytes).sum()
    }

    /// Device bytes at the peak: everything held, plus the largest phase.
    pub fn device_total(&self) -> u64 {
        let held: u64 = self
            .device
            .iter()
            .filter(|i| !i.phase)
            .map(|i| i.bytes)
            .sum();
        let phase = self
            .device
            .iter()
            .filter(|i| i.phase)
            .map(|i| i.bytes)
            .max();
        held + phase.unwrap_or(0)
    }

    /// The device peak on this machine: on a GPU, never below what cubecl's
    /// pools reserve once each page class is in use.
    pub fn device_peak(&self, machine: &Machine) -> u64 {
        match machine.device_bytes {
            Some(gpu) => self.device_total().max(self.device_floor(gpu)),
            None => self.device_total(),
        }
    }

    /// The pools' floor plus the CUDA context.
    fn device_floor(&self, gpu: u64) -> u64 {
        let context: u64 = self
            .device
            .iter()
            .filter(|i| i.what == CONTEXT)
            .map(|i| i.bytes)
            .sum();
        pool_floor(gpu) + context
    }

    /// Host bytes of the store alone (weights, Adam state, gradient buffer).
    pub fn store_bytes(&self) -> u64 {
        self.host
            .iter()
            .filter(|i| {
                i.what.starts_with("parameters (")
                    || i.what.starts_with("Adam")
                    || i.what.starts_with("gradient buffer")
            })
            .map(|i| i.bytes)
            .sum()
    }

    /// The plan as a table, with the machine's figures.
    pub fn table(&self, machine: &Machine) -> String {
        let mut out = String::new();
        let mut section = |title: &str, items: &[Item], total: u64, have: Option<(u64, &str)>| {
            let _ = writeln!(out, "{title}");
            for item in items {
                let _ = writeln!(
                    out,
                    "  {:<50} {:>10.2} GiB",
                    item.what,
                    item.bytes as f64 / GIB
                );
            }
            let _ = writeln!(out, "  {:<50} {:>10.2} GiB", "total", total as f64 / GIB);
            if let Some((bytes, source)) = have {
                let _ = writeln!(
                    out,
                    "  {:<50} {:>10.2} GiB ({source})",
                    "available",
                    bytes as f64 / GIB
                );
            }
        };
        section(
            "host",
            &self.host,
            self.host_total(),
            Some((machine.host_bytes, &machine.host_source)),
        );
        let mut device = self.device.clone();
        if let Some(gpu) = machine.device_bytes {
            device.push(Item::held(
                "(floor: context + cubecl's pages, 1/12 of the GPU)",
                self.device_floor(gpu),
            ));
        }
        section(
            match (machine.device_bytes.is_some(), self.devices) {
                (true, 1) => "device (GPU; of the two phases the larger counts)",
                (true, _) => "device (each GPU; of the two phases the larger counts)",
                (false, 1) => "device (the host: CPU backend)",
                (false, _) => "device (each logical device, in the host: CPU backend)",
            },
            &device,
            self.device_peak(machine),
            machine
                .device_bytes
                .map(|b| (b, machine.device_source.as_str())),
        );
        let _ = writeln!(
            out,
            "{:.1} host bytes/param",
            self.host_total() as f64 / self.params.max(1) as f64
        );
        out
    }

    /// Host and device bytes needed on this machine (on CPU backends every
    /// logical device's share comes out of host memory; a GPU holds its own).
    fn needs(&self, machine: &Machine) -> (u64, Option<u64>) {
        match machine.device_bytes {
            Some(_) => (self.host_total(), Some(self.device_peak(machine))),
            None => (self.host_total() + self.devices * self.device_total(), None),
        }
    }

    /// `Ok` when the job fits; otherwise what is needed, what is available,
    /// and what would fit.
    pub fn check(&self, job: &Job, machine: &Machine) -> Result<(), String> {
        let (host, device) = self.needs(machine);
        let mut problems = Vec::new();
        if host > machine.host_bytes {
            let store = if job.resident {
                " (the model, the runtime and the OS's headroom; --plan lists them)".to_string()
            } else {
                format!(
                    " ({} B/param in the store, buffers, the runtime and the OS's headroom; \
                     --plan lists them)",
                    job.store_bytes_per_param()
                )
            };
            // The lent GPU hosts grow RAM on demand: MemAvailable at start can understate.
            let grows = if machine.host_source == "MemAvailable" {
                "; pass --host-mem-gib if this machine's memory grows on demand"
            } else {
                ""
            };
            problems.push(format!(
                "not enough host memory: needs {:.2} GiB{store}, {:.2} GiB available ({}){grows}",
                host as f64 / GIB,
                machine.host_bytes as f64 / GIB,
                machine.host_source
            ));
        }
        if let (Some(need), Some(have)) = (device, machine.device_bytes) {
            if need > have {
                problems.push(format!(
                    "not enough GPU memory: needs {:.2} GiB, {:.2} GiB available ({})",
                    need as f64 / GIB,
                    have as f64 / GIB,
                    machine.device_source
                ));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{}; {}",
            problems.join("; "),
            suggestion(job, machine)
        ))
    }
}

/// Host bytes of the libraries, the token stream and the CUDA driver's host
/// side.
fn host_runtime(gpu: bool) -> u64 {
    if gpu {
        (1.5 * GIB) as u64
    } else {
        (0.25 * GIB) as u64
    }
}

/// The least headroom the plan leaves the OS and its page cache.
const MIN_HOST_HEADROOM: u64 = 1 << 30;

/// Host bytes any run needs before its model: the runtime and the OS's
/// least headroom.
fn host_floor(gpu: bool) -> u64 {
    host_runtime(gpu) + MIN_HOST_HEADROOM
}

/// What would fit: fewer kept graphs, fused mode, the engine instead of
/// resident, a smaller batch.
fn suggestion(job: &Job, machine: &Machine) -> String {
    let fits = |j: &Job| Plan::new(j).check_quiet(machine);
    let floor = host_floor(job.gpu);
    if machine.host_bytes < floor {
        return format!(
            "the runtime and the OS's headroom alone take {:.2} GiB",
            floor as f64 / GIB
        );
    }
    let mut tries = Vec::new();
    if !job.resident && job.kept_graphs.count() > 0 {
        let fewer = Job {
            kept_graphs: KeptGraphs::Auto,
            ..job.clone()
        }
        .place_kept_graphs(machine);
        let what = format!(
            "--keep-graphs {} (or auto: as many as fit)",
            fewer.kept_graphs
        );
        tries.push((fewer, what));
    }
    if job.resident {
        tries.push((
            Job {
                resident: false,
                ..job.clone()
            },
            "drop --resident (stream from host memory)".to_string(),
        ));
    }
    if job.compact_applies() && !job.compact() {
        tries.push((
            Job {
                host_layout: HostLayout::Compact,
                ..job.clone()
            },
            "--host-layout compact (no bf16 weights on the host; bf16 block gradients)".to_string(),
        ));
    }
    if !job.fused && !job.resident {
        tries.push((
            Job {
                fused: true,
                accum: 1,
                ..job.clone()
            },
            "--fused (12 B/param on the host)".to_string(),
        ));
    }
    for (candidate, what) in &tries {
        if fits(candidate) {
            return format!("try {what}");
        }
    }
    let mut base = job.clone();
    if !fits(&base) && !base.resident && !base.fused {
        base.fused = true;
    }
    for batch in (1..job.batch).rev() {
        let smaller = Job {
            batch,
            ..base.clone()
        };
        if fits(&smaller) {
            let fused = if base.fused && !job.fused {
                " --fused"
            } else {
                ""
            };
            return format!(
                "try --batch {batch}{fused} (with --accum to keep the tokens per step)"
            );
        }
    }
    if job.fused || job.resident {
        "no batch size fits: try a smaller model or a larger machine".into()
    } else {
        "no batch size fits: try --fused (12 B/param on the host) with a smaller model, or a larger machine".into()
    }
}

/// What cubecl's pools hold on a GPU with `gpu` bytes as soon as every page
/// class has been used once.
fn pool_floor(gpu: u64) -> u64 {
    (gpu as f64 * POOL_FLOOR_FRACTION) as u64
}

impl Plan {
    /// Whether the device part fits `machine` (always, on CPU backends).
    fn fits_device(&self, machine: &Machine) -> bool {
        match (self.needs(machine).1, machine.device_bytes) {
            (Some(need), Some(have)) => need <= have,
            _ => true,
        }
    }

    fn check_quiet(&self, machine: &Machine) -> bool {
        self.needs(machine).0 <= machine.host_bytes && self.fits_device(machine)
    }
}
