//! What a step reports: its loss and norm, and where its time went.

use crate::transfer::PagerStats;

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Mean loss over all tokens of all micro-batches.
    pub loss: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Factor the gradients were multiplied by (1 when not clipped).
    pub clip_scale: f64,
    /// Tokens in the step's micro-batches.
    pub tokens: usize,
    /// The loss or a gradient was not finite: nothing was updated.
    pub skipped: bool,
    /// Where the step's time went.
    pub split: StepSplit,
}

/// Where a step's wall time went, in seconds of host time, summed over
/// micro-batches and passes. The device runs behind the host, so a phase ends
/// when the host has handed its work over (or, for `backward_wait_s`, waited
/// for it). `backward_s` contains `backward_wait_s`, `download_s` and, in
/// fused mode, the part of `optimizer_s` that overlaps the backward.
///
/// The `*_bytes`/`*_copy_s` pairs are the copies timed on CUDA (zero
/// elsewhere): their ratio is the achieved rate. Uploads are timed on the copy
/// stream from a batch's first copy to its last, so gaps between copies count
/// against the rate; downloads from the copy's start to its end. A block's
/// gradients ride behind its backward on cubecl's stream, where no event
/// times them, nor the head's, which follow its last loss chunk: the timed
/// downloads are the embedding's gradients and the checkpoints'.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepSplit {
    /// Streamed forward without a graph (uploads, block compute, checkpoints).
    pub forward_s: f64,
    /// LM head and loss in chunks, and the embedding backward.
    pub head_s: f64,
    /// Recompute and backward of every block, gradients to the host.
    pub backward_s: f64,
    /// Waiting for a block's backward to finish on the device (the
    /// serialised baseline; in the pipeline the host never waits for it on
    /// its own: the wait falls into the next bind or `download_s`).
    pub backward_wait_s: f64,
    /// Host time handing blocks over in the backward: the checkpoint back,
    /// waiting for the block's weights, binding the next block (its copy).
    #[serde(default)]
    pub backward_bind_s: f64,
    /// Host time recording and submitting each block's recompute and
    /// backward (burn's autodiff graph and kernel launches), up to the flush.
    #[serde(default)]
    pub backward_launch_s: f64,
    /// Waiting for a block's gradient copies and writing them into the
    /// host buffer (fused sinks; accumulated gradients are the host
    /// worker's, or inline, and count in `optimizer_s`).
    pub download_s: f64,
    /// CPU optimizer (AdamW over the host slabs) and gradient accumulation.
    /// In the default (deferred) mode this is worker-thread time, mostly the
    /// previous step's update, which overlaps this step's forward.
    pub optimizer_s: f64,
    /// Time the thread that drives the device waited for the host worker to
    /// give a group back (the part of `optimizer_s` the device may feel).
    #[serde(default)]
    pub host_wait_s: f64,
    /// Host→device copies of the forward (weights).
    pub forward_h2d_bytes: u64,
    /// Their time on the copy stream.
    pub forward_h2d_copy_s: f64,
    /// Host→device copies after the forward (head, weights again, checkpoints).
    pub backward_h2d_bytes: u64,
    /// Their time on the copy stream.
    pub backward_h2d_copy_s: f64,
    /// Device→host copies timed on the copy stream (the embedding's gradients, host checkpoints).
    pub d2h_bytes: u64,
    /// Their time on the copy stream.
    pub d2h_copy_s: f64,
}

impl StepSplit {
    /// Adds the copies the pager timed between `from` and `to`; uploads count
    /// as the forward's with `forward`, else as the backward's.
    pub(super) fn add_copies(&mut self, from: &PagerStats, to: &PagerStats, forward: bool) {
        let up_bytes = to.upload_timed_bytes - from.upload_timed_bytes;
        let up_s = (to.upload_copy_ns - from.upload_copy_ns) as f64 * 1e-9;
        if forward {
            self.forward_h2d_bytes += up_bytes;
            self.forward_h2d_copy_s += up_s;
        } else {
            self.backward_h2d_bytes += up_bytes;
            self.backward_h2d_copy_s += up_s;
        }
        self.d2h_bytes += to.download_timed_bytes - from.download_timed_bytes;
        self.d2h_copy_s += (to.download_copy_ns - from.download_copy_ns) as f64 * 1e-9;
    }
}
