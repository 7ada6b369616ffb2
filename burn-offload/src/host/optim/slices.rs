//! How an update walks a group's slabs: in chunks across threads, or over an
//! embedding table's selected rows, the bf16 copy rounded as it goes.

use std::borrow::Cow;

use burn::tensor::bf16;
use rayon::prelude::*;

use crate::host::bf16::round_into;
use crate::host::throttle;

/// Elements per rayon task: large enough to amortise scheduling, small enough
/// to balance a block across cores.
pub(crate) const CHUNK: usize = 1 << 15;

/// A gradient as the host holds it: f32, or bf16 as a bf16 backward
/// produced it (read widened to f32, so an update sees the same values
/// either way).
#[derive(Debug, Clone, Copy)]
pub enum GradSlice<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values.
    Bf16(&'a [bf16]),
}

impl<'a> GradSlice<'a> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            GradSlice::F32(g) => g.len(),
            GradSlice::Bf16(g) => g.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `mid` values and the rest.
    pub fn split_at(self, mid: usize) -> (Self, Self) {
        match self {
            GradSlice::F32(g) => {
                let (a, b) = g.split_at(mid);
                (GradSlice::F32(a), GradSlice::F32(b))
            }
            GradSlice::Bf16(g) => {
                let (a, b) = g.split_at(mid);
                (GradSlice::Bf16(a), GradSlice::Bf16(b))
            }
        }
    }

    /// The values in `range`, as f32 (widened into a new buffer from bf16).
    pub fn f32_range(&self, range: std::ops::Range<usize>) -> Cow<'a, [f32]> {
        match *self {
            GradSlice::F32(g) => Cow::Borrowed(&g[range]),
            GradSlice::Bf16(g) => Cow::Owned(g[range].iter().map(|v| v.to_f32()).collect()),
        }
    }
}

/// The state a group's update works on: parameters, two moment buffers
/// (SGD uses the first as its momentum buffer) and the gradient; and, in bf16
/// compute mode, the bf16 copy of the parameters to write as they change.
pub struct UpdateSlices<'a> {
    /// The parameters, updated in place.
    pub params: &'a mut [f32],
    /// First moment (SGD: the momentum buffer).
    pub m: &'a mut [f32],
    /// Second moment (unused by SGD).
    pub v: &'a mut [f32],
    /// The gradient, scaled by the update's `grad_scale` as it is read.
    pub grads: GradSlice<'a>,
    /// The bf16 copy of the parameters, rewritten as they change.
    pub bf16: Option<&'a mut [bf16]>,
}

impl<'a> UpdateSlices<'a> {
    /// The first `mid` elements and the rest, as two updates' slices.
    pub fn split_at(self, mid: usize) -> (Self, Self) {
        let (p0, p1) = self.params.split_at_mut(mid);
        let (m0, m1) = self.m.split_at_mut(mid);
        let (v0, v1) = self.v.split_at_mut(mid);
        let (g0, g1) = self.grads.split_at(mid);
        let (b0, b1) = match self.bf16 {
            Some(b) => {
                let (b0, b1) = b.split_at_mut(mid);
                (Some(b0), Some(b1))
            }
            None => (None, None),
        };
        let slices = |params, m, v, grads, bf16| UpdateSlices {
            params,
            m,
            v,
            grads,
            bf16,
        };
        (slices(p0, m0, v0, g0, b0), slices(p1, m1, v1, g1, b1))
    }
}

/// Which elements of a group an update touches.
#[derive(Debug, Clone, Copy)]
pub enum Rows<'a> {
    /// Every element.
    All,
    /// The slices are a `[rows, width]` matrix: only the rows `r` with
    /// `picked[r] == pick` (an embedding table's rows that the next forward
    /// reads first, then the others).
    Picked {
        /// Elements per row.
        width: usize,
        /// Per row: whether it is one of the picked rows.
        picked: &'a [bool],
        /// Update the picked rows (`true`) or the others (`false`).
        pick: bool,
    },
}

/// Runs `update` on matching pieces of the slices in parallel: chunks of
/// [`CHUNK`], or the selected rows. With a bf16 copy, each piece's new
/// parameters are rounded into it while they are still in cache (no second
/// pass over the slab). The update is elementwise, so how the slices are cut
/// changes no result. Each piece first waits while one of the forward's
/// weight copies is in flight (`host::throttle`).
pub(super) fn par_update<F>(s: UpdateSlices<'_>, rows: Rows<'_>, update: F)
where
    F: Fn(&mut [f32], &mut [f32], &mut [f32], &[f32]) + Sync + Send,
{
    let (piece, selected): (usize, Box<dyn Fn(usize) -> bool + Sync>) = match rows {
        Rows::All => (CHUNK, Box::new(|_| true)),
        Rows::Picked {
            width,
            picked,
            pick,
        } => {
            assert!(
                width > 0 && s.params.len() == picked.len() * width,
                "rows of {width} do not tile the slices"
            );
            (width, Box::new(move |r| picked[r] == pick))
        }
    };
    let grads = s.grads;
    let pieces = s
        .params
        .par_chunks_mut(piece)
        .zip(s.m.par_chunks_mut(piece))
        .zip(s.v.par_chunks_mut(piece))
        .enumerate();
    // A piece's gradient, widened from bf16 only for the pieces updated.
    let grad = |r: usize, len: usize| grads.f32_range(r * piece..r * piece + len);
    match s.bf16 {
        Some(out) => pieces
            .zip(out.par_chunks_mut(piece))
            .for_each(|((r, ((p, m), v)), o)| {
                if selected(r) {
                    throttle::wait_for_copies();
                    update(p, m, v, &grad(r, p.len()));
                    round_into(o, p);
                }
            }),
        None => pieces.for_each(|(r, ((p, m), v))| {
            if selected(r) {
                throttle::wait_for_copies();
                update(p, m, v, &grad(r, p.len()));
            }
        }),
    }
}
