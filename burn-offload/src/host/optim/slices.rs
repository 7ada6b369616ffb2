//! How an update walks a group's slabs: in chunks across threads, or over an
//! embedding table's selected rows, the bf16 copy rounded as it goes.

use burn::tensor::bf16;
use rayon::prelude::*;

use crate::host::bf16::round_into;
use crate::host::throttle;

/// Elements per rayon task: large enough to amortise scheduling, small enough
/// to balance a block across cores.
pub(crate) const CHUNK: usize = 1 << 15;

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
    pub grads: &'a [f32],
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
    let pieces = s
        .params
        .par_chunks_mut(piece)
        .zip(s.m.par_chunks_mut(piece))
        .zip(s.v.par_chunks_mut(piece))
        .zip(s.grads.par_chunks(piece))
        .enumerate();
    match s.bf16 {
        Some(out) => {
            pieces
                .zip(out.par_chunks_mut(piece))
                .for_each(|((r, (((p, m), v), g)), o)| {
                    if selected(r) {
                        throttle::wait_for_copies();
                        update(p, m, v, g);
                        round_into(o, p);
                    }
                })
        }
        None => pieces.for_each(|(r, (((p, m), v), g))| {
            if selected(r) {
                throttle::wait_for_copies();
                update(p, m, v, g);
            }
        }),
    }
}
