//! The settings the plan decides where the user leaves them to it, and
//! their spellings on the command line.

/// Bytes of an f32.
pub(super) const F32: u64 = 4;

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

/// Whether the type parameter (`--resident --host-params`) runs each block
/// as a checkpoint (`burn_offload::set_offload_recompute`): only the block
/// inputs kept, in host memory, each block's graph rebuilt in its backward
/// and its gradients sent to host memory, so the GPU holds one block's
/// activations; or the whole step's graph on the GPU, faster where it fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Recompute {
    /// Off when the plan fits the GPU with the whole graph, else on.
    Auto,
    On,
    Off,
}
