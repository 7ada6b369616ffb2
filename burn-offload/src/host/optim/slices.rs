//! How an update walks a group's slabs: in chunks across threads, or over an
//! embedding table's selected rows, the bf16 copy rounded as it goes.

use std::borrow::Cow;

use burn::tensor::bf16;
use rayon::prelude::*;

use super::quant::{dequantize_block, quantize_block, QUANT_BLOCK, SIGNED, UNSIGNED};
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

/// A group's moments as an update writes them: f32, or 8-bit blockwise
/// (codes and one scale per [`QUANT_BLOCK`] values, from the group's start).
pub enum MomentSlices<'a> {
    /// f32 values.
    F32 {
        /// First moment (SGD: the momentum buffer).
        m: &'a mut [f32],
        /// Second moment (unused by SGD).
        v: &'a mut [f32],
    },
    /// 8-bit codes and their blocks' scales.
    Q8 {
        /// First moment's codes (signed map).
        m: &'a mut [u8],
        /// Its blocks' scales.
        m_absmax: &'a mut [f32],
        /// Second moment's codes (unsigned map).
        v: &'a mut [u8],
        /// Its blocks' scales.
        v_absmax: &'a mut [f32],
    },
}

impl<'a> MomentSlices<'a> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            MomentSlices::F32 { m, .. } => m.len(),
            MomentSlices::Q8 { m, .. } => m.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `mid` values and the rest; 8-bit moments split only at a
    /// block boundary.
    pub fn split_at(self, mid: usize) -> (Self, Self) {
        match self {
            MomentSlices::F32 { m, v } => {
                let ((m0, m1), (v0, v1)) = (m.split_at_mut(mid), v.split_at_mut(mid));
                (
                    MomentSlices::F32 { m: m0, v: v0 },
                    MomentSlices::F32 { m: m1, v: v1 },
                )
            }
            MomentSlices::Q8 {
                m,
                m_absmax,
                v,
                v_absmax,
            } => {
                assert_eq!(mid % QUANT_BLOCK, 0, "8-bit moments split inside a block");
                let b = mid / QUANT_BLOCK;
                let ((m0, m1), (v0, v1)) = (m.split_at_mut(mid), v.split_at_mut(mid));
                let ((ma0, ma1), (va0, va1)) = (m_absmax.split_at_mut(b), v_absmax.split_at_mut(b));
                (
                    MomentSlices::Q8 {
                        m: m0,
                        m_absmax: ma0,
                        v: v0,
                        v_absmax: va0,
                    },
                    MomentSlices::Q8 {
                        m: m1,
                        m_absmax: ma1,
                        v: v1,
                        v_absmax: va1,
                    },
                )
            }
        }
    }
}

/// The state a group's update works on: parameters, two moments (SGD uses
/// the first as its momentum buffer) and the gradient; and, in bf16 compute
/// mode, the bf16 copy of the parameters to write as they change.
pub struct UpdateSlices<'a> {
    /// The parameters, updated in place.
    pub params: &'a mut [f32],
    /// The moments.
    pub moments: MomentSlices<'a>,
    /// The gradient, scaled by the update's `grad_scale` as it is read.
    pub grads: GradSlice<'a>,
    /// The bf16 copy of the parameters, rewritten as they change.
    pub bf16: Option<&'a mut [bf16]>,
}

impl<'a> UpdateSlices<'a> {
    /// The first `mid` elements and the rest, as two updates' slices.
    pub fn split_at(self, mid: usize) -> (Self, Self) {
        let (p0, p1) = self.params.split_at_mut(mid);
        let (m0, m1) = self.moments.split_at(mid);
        let (g0, g1) = self.grads.split_at(mid);
        let (b0, b1) = match self.bf16 {
            Some(b) => {
                let (b0, b1) = b.split_at_mut(mid);
                (Some(b0), Some(b1))
            }
            None => (None, None),
        };
        let slices = |params, moments, grads, bf16| UpdateSlices {
            params,
            moments,
            grads,
            bf16,
        };
        (slices(p0, m0, g0, b0), slices(p1, m1, g1, b1))
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
    // A piece's gradient, widened from bf16 only for the pieces updated.
    let grad = |r: usize, len: usize| grads.f32_range(r * piece..r * piece + len);
    // With 8-bit moments each piece is dequantised into f32, updated by the
    // same math, and quantised again with its blocks' new scales.
    let update_piece = |r: usize, p: &mut [f32], moments: MomentSlices<'_>| {
        throttle::wait_for_copies();
        match moments {
            MomentSlices::F32 { m, v } => update(p, m, v, &grad(r, p.len())),
            MomentSlices::Q8 {
                m,
                m_absmax: ma,
                v,
                v_absmax: va,
            } => {
                // Block by block, so the f32 moments stay in the core's
                // first-level cache between the three passes.
                let grads = grad(r, p.len());
                let (mut mf, mut vf) = ([0.0f32; QUANT_BLOCK], [0.0f32; QUANT_BLOCK]);
                let blocks = p
                    .chunks_mut(QUANT_BLOCK)
                    .zip(m.chunks_mut(QUANT_BLOCK).zip(v.chunks_mut(QUANT_BLOCK)))
                    .zip(grads.chunks(QUANT_BLOCK))
                    .zip(ma.iter_mut().zip(va.iter_mut()));
                for (((p, (m, v)), g), (m_scale, v_scale)) in blocks {
                    let (mf, vf) = (&mut mf[..p.len()], &mut vf[..p.len()]);
                    dequantize_block(&SIGNED, m, *m_scale, mf);
                    dequantize_block(&UNSIGNED, v, *v_scale, vf);
                    update(p, mf, vf, g);
                    *m_scale = quantize_block(&SIGNED, mf, m);
                    *v_scale = quantize_block(&UNSIGNED, vf, v);
                }
            }
        }
    };
    let pieces: Vec<MomentSlices<'_>> = match s.moments {
        MomentSlices::F32 { m, v } => m
            .chunks_mut(piece)
            .zip(v.chunks_mut(piece))
            .map(|(m, v)| MomentSlices::F32 { m, v })
            .collect(),
        MomentSlices::Q8 {
            m,
            m_absmax,
            v,
            v_absmax,
        } => {
            assert_eq!(piece % QUANT_BLOCK, 0, "8-bit moments update whole blocks");
            let blocks = piece / QUANT_BLOCK;
            m.chunks_mut(piece)
                .zip(m_absmax.chunks_mut(blocks))
                .zip(v.chunks_mut(piece).zip(v_absmax.chunks_mut(blocks)))
                .map(|((m, m_absmax), (v, v_absmax))| MomentSlices::Q8 {
                    m,
                    m_absmax,
                    v,
                    v_absmax,
                })
                .collect()
        }
    };
    let pieces = s.params.par_chunks_mut(piece).zip(pieces).enumerate();
    match s.bf16 {
        Some(out) => pieces
            .zip(out.par_chunks_mut(piece))
            .for_each(|((r, (p, moments)), o)| {
                if selected(r) {
                    update_piece(r, p, moments);
                    round_into(o, p);
                }
            }),
        None => pieces.for_each(|(r, (p, moments))| {
            if selected(r) {
                update_piece(r, p, moments);
            }
        }),
    }
}
