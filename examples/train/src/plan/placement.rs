//! The knobs a job leaves to the plan, decided for a machine: each
//! `place_*` takes the job with its knob decided, in the order
//! [`Job::placed`] calls them.

use super::estimate::{kept_attention_bytes, kept_graph_bytes, shape, Plan};
use super::job::{Job, Machine};
use super::knobs::F32;
use super::knobs::{BlockInputs, HostLayout, KeptGraphs, ParamCache, Recompute};

impl Job {
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
            if !Plan::new(&full).check_quiet(machine) {
                self.host_layout = HostLayout::Compact;
            }
        }
        self
    }

    /// The job with [`BlockInputs::Auto`] decided for `machine`: on a GPU the
    /// block inputs go to the device when the whole plan still fits it, else
    /// to host memory; on CPU backends the device is the host.
    pub fn place_block_inputs(mut self, machine: &Machine) -> Self {
        if self.block_inputs == BlockInputs::Auto {
            self.block_inputs = BlockInputs::Device;
            if self.gpu && !Plan::new(&self).check_quiet(machine) {
                self.block_inputs = BlockInputs::Host;
            }
        }
        self
    }

    /// The job with as few recomputed blocks' inputs kept on the device as
    /// let the host hold the rest, where block inputs go to host memory and
    /// the host cannot hold every one (call it after
    /// [`Job::place_gradient_blocks`], before [`Job::place_kept_attention`],
    /// which fills the room left): a long sequence's checkpoints outgrow the
    /// host's memory before the GPU's, which holds one block's activations
    /// at a time. None where no count fits both the host and the GPU: the
    /// plan then says how much host memory is short.
    pub fn place_device_block_inputs(mut self, machine: &Machine) -> Self {
        self.device_block_inputs = 0;
        let layers = shape(&self.config).layers;
        if self.host_block_inputs(layers) == 0 {
            return self;
        }
        let fits_host = |job: &Job| Plan::new(job).needs(machine).0 <= machine.host_bytes;
        if fits_host(&self) {
            return self;
        }
        let fewest = (1..=layers as usize)
            .map(|n| Job {
                device_block_inputs: n,
                ..self.clone()
            })
            .find(fits_host);
        match fewest {
            Some(job) if Plan::new(&job).fits_device(machine) => job,
            _ => self,
        }
    }

    /// The job with the blocks' MLP over tiles of
    /// [`burn_offload::ops::mlp::MLP_TILE_TOKENS`] where the engine's plan
    /// does not fit the GPU without (call it after
    /// [`Job::place_block_inputs`]): the tiles keep none of the MLP's
    /// `[tokens, d_ff]` values for the backward, at the price of its two
    /// projections again. Models whose MLP has biases, or whose micro-batch
    /// is one tile, run it plain.
    pub fn place_mlp_tile(mut self, machine: &Machine) -> Self {
        if !self.gpu
            || self.resident
            || !self.mlp_can_tile()
            || Plan::new(&self).fits_device(machine)
        {
            return self;
        }
        self.mlp_tile = Some(burn_offload::ops::mlp::MLP_TILE_TOKENS);
        self
    }

    /// Whether the plan may still put the MLP over tiles: not yet tiled, an
    /// MLP without biases, and a micro-batch of more than one tile.
    fn mlp_can_tile(&self) -> bool {
        self.mlp_tile.is_none()
            && shape(&self.config).mlp_per_token > 0
            && self.batch * self.seq_len > burn_offload::ops::mlp::MLP_TILE_TOKENS
    }

    /// The job with [`Recompute::Auto`] decided for `machine`: with
    /// `--host-params`, off (the whole step's graph on the device, no second
    /// forward) on a CPU and where the plan fits the GPU so, else on.
    pub fn place_block_recompute(mut self, machine: &Machine) -> Self {
        if self.block_recompute != Recompute::Auto || !(self.resident && self.host_params) {
            return self;
        }
        let whole = Job {
            block_recompute: Recompute::Off,
            ..self.clone()
        };
        self.block_recompute = if !self.gpu || Plan::new(&whole).fits_device(machine) {
            Recompute::Off
        } else {
            Recompute::On
        };
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
            job.place_block_recompute(machine)
                .place_param_cache(machine)
                .place_host_layout(machine)
                .place_block_inputs(machine)
                .place_mlp_tile(machine)
                .place_gradient_blocks(machine)
                .place_device_block_inputs(machine)
                .place_kept_attention(machine)
                .place_kept_graphs(machine)
        };
        let first = chain(self.clone());
        let layers = shape(&self.config).layers as usize;
        if first.kept_attention >= layers - first.kept_graphs.count().min(layers) {
            return first;
        }
        let can_tile = self.mlp_can_tile();
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
                job.mlp_tile = Some(burn_offload::ops::mlp::MLP_TILE_TOKENS);
            }
            let job = chain(job);
            if job.kept_attention > best.kept_attention && Plan::new(&job).check_quiet(machine) {
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
        let room = fillable(gpu);
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
        let room = fillable(gpu);
        let layers = shape(&self.config).layers as usize;
        let fit = (room.saturating_sub(rest) / per_block) as usize;
        self.kept_graphs = KeptGraphs::Count(fit.min(layers));
        // Blocks whose graphs are kept are not recomputed: no outputs kept for them.
        self.kept_attention = self.kept_attention.min(layers - fit.min(layers));
        self
    }
}

/// The device bytes the plan lets kept values fill: 90% of the free memory
/// measured at start, the margin for the allocator's fragmentation.
fn fillable(gpu: u64) -> u64 {
    (gpu as f64 * 0.9) as u64
}
