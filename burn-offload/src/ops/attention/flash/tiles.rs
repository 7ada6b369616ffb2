//! The `mma.sync` kernels' tiles of `q`, `k`, `v` and the output gradient,
//! moved from global memory in 16-byte vectors ("octets": 8 bf16 or f16
//! values): one load instruction where scalar loads took eight, and every
//! supported head width (a multiple of 16) is a whole number of octets.
//!
//! A tile moves in two steps, [`fetch`] (global memory into the unit's
//! registers) and [`stash`] (registers into shared memory), so that a
//! kernel can issue the loads of its next tile before its products on the
//! current one and store them after, instead of waiting for them.

use cubecl::prelude::barrier::copy_async;
use cubecl::prelude::*;

use super::kernels::{PAD, TILE, UNITS};

/// Values in an octet.
pub(super) const OCTET: usize = 8;

/// Eight consecutive values of a row: the widest load a unit issues.
pub(super) type Octet<E> = Vector<E, Const<8>>;

/// The unit's octets of the `TILE` rows of `dim` values of `t` (a `[b, h,
/// s, d]` tensor read as octets) from position `first` on, of the head at
/// element offset `base` (rows `row_stride` elements apart; the launcher
/// makes both multiples of 8 and the columns contiguous). Rows past the
/// sequence's end (`seq`) read its last row (the launch is unchecked:
/// every index must be in bounds), which [`stash`] replaces by zeros.
///
/// Consecutive units read consecutive octets of a row, so a plane reads
/// whole rows of 128 bytes (at width 64) in one transaction each.
#[cube]
pub(super) fn fetch<F: Float>(
    t: &Tensor<Octet<F>>,
    base: usize,
    row_stride: usize,
    seq: usize,
    first: usize,
    #[comptime] dim: usize,
) -> Array<Octet<F>> {
    // Octets a row, and rows the cube's units cover at once (each unit
    // keeps one column of octets and steps down the rows).
    let across = comptime!(dim / OCTET);
    let down = comptime!(UNITS / (dim / OCTET));
    let unit = UNIT_POS as usize;
    let row = unit / across;
    let at = base / OCTET + unit % across;
    let rows = row_stride / OCTET;
    let mut regs = Array::<Octet<F>>::new(comptime!(TILE / down));
    // Branch-free (see `load_rows`): all the loads issue before the first
    // one is waited for.
    #[unroll]
    for i in 0..comptime!(TILE / down) {
        let pos = first + row + comptime!(i * down);
        regs[i] = t[at + select(pos < seq, pos, seq - 1) * rows];
    }
    regs
}

/// The octets [`fetch`] read for the rows from position `first` on into
/// `tile`'s rows from row `from` on (rows `dim + PAD` values apart, as the
/// `ldmatrix` reads take them, so each row starts on a 16-byte boundary and
/// each octet is one 16-byte store), zeros for the rows past the
/// sequence's end (`seq`).
#[cube]
pub(super) fn stash<F: Float>(
    regs: &Array<Octet<F>>,
    tile: &mut SharedMemory<F>,
    from: usize,
    seq: usize,
    first: usize,
    #[comptime] dim: usize,
) {
    let across = comptime!(dim / OCTET);
    let down = comptime!(UNITS / (dim / OCTET));
    let ld = comptime!((dim + PAD) / OCTET);
    let unit = UNIT_POS as usize;
    let (row, col) = (unit / across, unit % across);
    let mut octets = tile
        .slice_mut(from * comptime!(dim + PAD), tile.len())
        .into_vectorized()
        .with_vector_size::<Const<8>>();
    // One branch for the cube: only a sequence's last tile has rows past
    // its end, and the others store without a select per register.
    if first + TILE <= seq {
        #[unroll]
        for i in 0..comptime!(TILE / down) {
            octets[(row + comptime!(i * down)) * ld + col] = regs[i];
        }
    } else {
        #[unroll]
        for i in 0..comptime!(TILE / down) {
            let r = row + comptime!(i * down);
            let zero = Octet::<F>::new(F::from_int(0));
            octets[r * ld + col] = select(first + r < seq, regs[i], zero);
        }
    }
}

/// [`fetch`] then [`stash`]: a tile that nothing overlaps.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_octets<F: Float>(
    t: &Tensor<Octet<F>>,
    tile: &mut SharedMemory<F>,
    from: usize,
    base: usize,
    row_stride: usize,
    seq: usize,
    first: usize,
    #[comptime] dim: usize,
) {
    let regs = fetch::<F>(t, base, row_stride, seq, first, dim);
    stash::<F>(&regs, tile, from, seq, first, dim);
}

/// [`fetch`] and [`stash`] at once through `cp.async`: the unit's octets
/// go from global to shared memory without passing through its registers,
/// and are there once the unit has committed them to a barrier
/// (`commit_copy_async`) and that barrier's phase has completed. Rows past
/// the sequence's end (`seq`) hold a copy of its last row, not zeros: the
/// backward gives them no weight (their log-sum-exp is `1e30`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_octets<F: Float>(
    t: &Tensor<Octet<F>>,
    tile: &mut SharedMemory<F>,
    from: usize,
    base: usize,
    row_stride: usize,
    seq: usize,
    first: usize,
    #[comptime] dim: usize,
) {
    let across = comptime!(dim / OCTET);
    let down = comptime!(UNITS / (dim / OCTET));
    let ld = comptime!(dim + PAD);
    let unit = UNIT_POS as usize;
    let (row, col) = (unit / across, unit % across);
    let at = base / OCTET + col;
    let rows = row_stride / OCTET;
    #[unroll]
    for i in 0..comptime!(TILE / down) {
        let r = row + comptime!(i * down);
        let pos = first + r;
        let src = at + select(pos < seq, pos, seq - 1) * rows;
        // The destination in elements of `tile` (the copy's raw pointer
        // arithmetic is in the slice's own element type, so the shared
        // slice stays scalar and is only retyped).
        let dst = (from + r) * ld + col * OCTET;
        let mut octet = unsafe {
            tile.slice_mut(dst, dst + OCTET)
                .downcast_unchecked::<Octet<F>>()
        };
        copy_async(&t.slice(src, src + 1), &mut octet, comptime!(OCTET as u32));
    }
}

/// The unit's value of the `TILE` values of an f32 `[b, h, s, 1]` tensor
/// from position `first` on, of the head at offset `base` (rows
/// `row_stride` apart), as `load_stats` reads them: positions past the
/// sequence's end (`seq`) read its last, and the units past the first
/// `TILE` read a row again, both of which [`stash_stat`] drops.
#[cube]
pub(super) fn fetch_stat(
    t: &Tensor<f32>,
    base: usize,
    row_stride: usize,
    seq: usize,
    first: usize,
) -> f32 {
    let pos = first + UNIT_POS as usize % TILE;
    t[base + select(pos < seq, pos, seq - 1) * row_stride]
}

/// The value [`fetch_stat`] read for the rows from position `first` on
/// into `out[from..from + TILE]`; `past` past the sequence's end (`seq`).
#[cube]
pub(super) fn stash_stat(
    x: f32,
    out: &mut SharedMemory<f32>,
    from: usize,
    seq: usize,
    first: usize,
    past: f32,
) {
    let i = UNIT_POS as usize;
    if i < TILE {
        out[from + i] = select(first + i < seq, x, past);
    }
}
