//! The fused kernels (cubecl's prelude has a `Tensor` of its own, so they
//! live apart from the launchers).
// Kernel code: cubecl's integers have no `div_ceil`.
#![allow(clippy::manual_div_ceil)]

use cubecl::ir::FastMath;
use cubecl::prelude::*;

/// Planes (warps of 32 units) per cube.
pub(super) const PLANES: usize = 4;
/// Rows (queries or keys) per cube: 16 per plane.
pub(super) const TILE: usize = 16 * PLANES;
/// Units per cube.
pub(super) const UNITS: usize = 32 * PLANES;
/// Padding of a shared row, in elements: shifts consecutive rows across
/// banks (WMMA needs rows on 16-byte boundaries: 8 halves or 4 floats).
pub(super) const PAD: usize = 8;
/// Large negative stand-in for −∞ as a running maximum: `exp` of the
/// difference of two of them is 1, not NaN. The kernels see no infinity
/// (past the sequence the log-sum-exp is 1e30), which lets `exp` be
/// CUDA's `__expf` (fast math: an `ex2` instruction, not `expf`'s ~20).
pub(super) const LOWEST: f32 = -1.0e30;

/// `TILE` rows of `dim` values of `t` (a `[b, h, s, d]` tensor) from
/// position `first` on, of the head at offset `base` (rows `row_stride`
/// apart, columns `col_stride`), into `tile` with a row stride of
/// `dim + PAD`; zeros past the sequence's end (`seq`).
///
/// The strides come in as values read once at the kernel's start: a
/// tensor's shape and strides live in global memory, and after a store to
/// global memory (the backward's atomic adds) the compiler would read them
/// again at every use.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_rows<F: Float, S: Float>(
    t: &Tensor<F>,
    tile: &mut SharedMemory<S>,
    base: usize,
    row_stride: usize,
    col_stride: usize,
    seq: usize,
    first: usize,
    #[comptime] dim: usize,
) {
    // Each unit keeps one column and steps down the rows (`dim` divides
    // the cube's units).
    let per = comptime!(UNITS / dim);
    let col = UNIT_POS as usize % dim;
    let mut row = UNIT_POS as usize / dim;
    let at = base + col * col_stride;
    // Branch-free: a load inside an `if` would end a basic block, and
    // the compiler would then wait out each load's latency in turn
    // instead of issuing all of them first (the kernels ran at a tenth of
    // their speed). Rows past the end read the last row (the launch is
    // unchecked: every index must be in bounds), which the select drops.
    #[unroll]
    for _ in 0..comptime!(TILE / per) {
        let pos = first + row;
        let inside = pos < seq;
        let x = S::cast_from(t[at + select(inside, pos, seq - 1) * row_stride]);
        tile[row * comptime!(dim + PAD) + col] = select(inside, x, S::from_int(0));
        row += per;
    }
}

/// `TILE` values of an f32 `[b, h, s, 1]` tensor from position `first` on
/// (of the head at offset `base`, rows `row_stride` apart) into `out`;
/// `past` past the sequence's end (`seq`).
#[cube]
pub(super) fn load_stats(
    t: &Tensor<f32>,
    out: &mut SharedMemory<f32>,
    base: usize,
    row_stride: usize,
    seq: usize,
    first: usize,
    past: f32,
) {
    let i = UNIT_POS as usize;
    if i < TILE {
        let pos = first + i;
        let inside = pos < seq;
        let x = t[base + select(inside, pos, seq - 1) * row_stride];
        out[i] = select(inside, x, past);
    }
}

/// How many of a tile's columns from `first_key` on lie before position
/// `limit` (`limit − first_key`, at least 0): for a query row, the keys up
/// to the query's position (`limit` its position plus one), or those before
/// its sliding window (`limit` its position plus one less the window); for
/// a key row, the queries before the key or inside its window.
#[cube]
pub(super) fn visible_columns(limit: usize, first_key: usize) -> usize {
    let mut visible = 0usize;
    if limit > first_key {
        visible = limit - first_key;
    }
    visible
}

/// The column a lane of the pair `2·row + half` visits at step `c` of a
/// walk along its row of `width` columns: `2·((c + row) mod width/2) +
/// half`. Each row starts at its own column, so that at every step the
/// plane's 32 lanes touch 32 different banks (shared rows lie a multiple of
/// 8 words apart, so in step, every fourth row would share a bank).
#[cube]
fn rotated(c: usize, row: usize, half: usize, #[comptime] width: usize) -> usize {
    2 * ((c + row) % comptime!(width / 2)) + half
}

/// The plane's 16 rows of `width` columns of `a` from row `a_row` (row
/// stride `width + PAD`) as `width / ks` A fragments: an operand that
/// several products share is read from shared memory once.
#[cube]
fn row_fragments<S: Float>(
    a: &SharedMemory<S>,
    a_offset: usize,
    #[comptime] width: usize,
    #[comptime] ks: usize,
) -> Sequence<cmma::Matrix<S>> {
    let ld = comptime!(width + PAD);
    let mut frags = Sequence::new();
    #[unroll]
    for kk in 0..comptime!(width / ks) {
        frags.push(cmma::Matrix::<S>::from_slice(
            cmma::MatrixIdent::A,
            16usize,
            16usize,
            ks,
            cmma::MatrixLayout::RowMajor,
            &a.slice(a_offset + kk * ks, a.len()),
            ld as u32,
        ));
    }
    frags
}

/// `a·bᵀ` for the plane's 16 rows of `a` (as [`row_fragments`] of `dim`
/// columns) and the `TILE` rows of `b` (row stride `dim + PAD`), stored at
/// `out_offset` of `out` (row stride `out_stride`).
///
/// The column blocks are independent sums, interleaved so that each
/// product waits on no other (a chain of dependent products leaves the
/// tensor cores idle for their latency).
#[cube]
fn product_transposed<S: Float>(
    a: &Sequence<cmma::Matrix<S>>,
    b: &SharedMemory<S>,
    out: &mut SharedMemory<f32>,
    out_offset: usize,
    out_stride: u32,
    #[comptime] dim: usize,
    #[comptime] ks: usize,
) {
    let ld = comptime!(dim + PAD);
    let acc = zeros(TILE, ks);
    #[unroll]
    for kk in 0..comptime!(dim / ks) {
        #[unroll]
        for n in 0..comptime!(TILE / 16) {
            let y = cmma::Matrix::<S>::from_slice(
                cmma::MatrixIdent::B,
                16usize,
                16usize,
                ks,
                cmma::MatrixLayout::ColMajor,
                &b.slice(comptime!(n * 16 * ld + kk * ks), b.len()),
                ld as u32,
            );
            cmma::execute::<S, S, f32, f32>(a.index(kk), &y, acc.index(n), acc.index(n));
        }
    }
    #[unroll]
    for n in 0..comptime!(TILE / 16) {
        cmma::store(
            &mut out.slice_mut(out_offset + n * 16, out.len()),
            acc.index(n),
            out_stride,
            cmma::MatrixLayout::RowMajor,
        );
    }
}

/// `acc[n] += a·b` for the plane's 16 rows of `a` (`TILE` columns, row
/// stride `TILE + PAD`, from `a_offset`) and `b` (`TILE` rows of `dim`
/// columns, stride `dim + PAD`): `acc[n]` is output columns `16n..16n+16`.
#[cube]
fn accumulate_product<S: Float>(
    a: &SharedMemory<S>,
    b: &SharedMemory<S>,
    acc: &Sequence<cmma::Matrix<f32>>,
    a_offset: usize,
    #[comptime] dim: usize,
    #[comptime] ks: usize,
) {
    let ldb = comptime!(dim + PAD);
    let x = row_fragments::<S>(a, a_offset, TILE, ks);
    // Independent sums interleaved (see `product_transposed`).
    #[unroll]
    for kk in 0..comptime!(TILE / ks) {
        #[unroll]
        for n in 0..comptime!(dim / 16) {
            let y = cmma::Matrix::<S>::from_slice(
                cmma::MatrixIdent::B,
                16usize,
                16usize,
                ks,
                cmma::MatrixLayout::RowMajor,
                &b.slice(kk * ks * ldb + n * 16, b.len()),
                ldb as u32,
            );
            cmma::execute::<S, S, f32, f32>(x.index(kk), &y, acc.index(n), acc.index(n));
        }
    }
}

/// `width / 16` zeroed accumulators.
#[cube]
fn zeros(#[comptime] width: usize, #[comptime] ks: usize) -> Sequence<cmma::Matrix<f32>> {
    let mut acc = Sequence::new();
    #[unroll]
    for _ in 0..comptime!(width / 16) {
        acc.push(cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            16usize,
            16usize,
            ks,
            cmma::MatrixLayout::Undefined,
            0.0,
        ));
    }
    acc
}

/// The plane's accumulators as 16 rows of `dim` f32 at `offset` of
/// `scratch` (row stride `dim + PAD`).
#[cube]
fn spill(
    acc: &Sequence<cmma::Matrix<f32>>,
    scratch: &mut SharedMemory<f32>,
    offset: usize,
    #[comptime] dim: usize,
) {
    let ld = comptime!(dim + PAD);
    #[unroll]
    for n in 0..comptime!(dim / 16) {
        cmma::store(
            &mut scratch.slice_mut(offset + n * 16, scratch.len()),
            acc.index(n),
            ld as u32,
            cmma::MatrixLayout::RowMajor,
        );
    }
}

/// 16 rows of `dim` f32 at `offset` of `scratch` (as [`spill`] left
/// them), times `scale`, into positions `first..first + 16` of `out` (the
/// head at offset `base`, strides as [`load_rows`] takes them), those
/// before the sequence's end (`seq`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_rows<F: Float>(
    scratch: &SharedMemory<f32>,
    out: &mut Tensor<F>,
    offset: usize,
    base: usize,
    row_stride: usize,
    col_stride: usize,
    seq: usize,
    first: usize,
    scale: f32,
    #[comptime] dim: usize,
) {
    let ld = comptime!(dim + PAD);
    let lane = UNIT_POS_X as usize;
    #[unroll]
    for step in 0..comptime!(16 * dim / 32) {
        let i = comptime!(step * 32) + lane;
        let (row, col) = (i / dim, i % dim);
        let x = F::cast_from(scratch[offset + row * ld + col] * scale);
        if first + row < seq {
            out[base + (first + row) * row_stride + col * col_stride] = x;
        }
    }
}

/// 16 rows of `dim` f32 at `offset` of `scratch` added (atomically) to
/// positions `first..first + 16` of the f32 sums `out` (the head at offset
/// `base`, strides as [`load_rows`] takes them), those before the
/// sequence's end (`seq`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn add_rows(
    scratch: &SharedMemory<f32>,
    out: &mut Tensor<Atomic<f32>>,
    offset: usize,
    base: usize,
    row_stride: usize,
    col_stride: usize,
    seq: usize,
    first: usize,
    #[comptime] dim: usize,
) {
    let ld = comptime!(dim + PAD);
    let lane = UNIT_POS_X as usize;
    #[unroll]
    for step in 0..comptime!(16 * dim / 32) {
        let i = comptime!(step * 32) + lane;
        let (row, col) = (i / dim, i % dim);
        let x = scratch[offset + row * ld + col];
        if first + row < seq {
            out[base + (first + row) * row_stride + col * col_stride].fetch_add(x);
        }
    }
}

/// The forward: a cube per `TILE` queries (the last tiles, which see the
/// most keys, first) of head `CUBE_POS_X` of sequence `CUBE_POS_Z`.
#[cube(launch_unchecked, fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
pub(super) fn forward_kernel<F: Float, S: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    scale: f32,
    window: u32,
    #[comptime] dim: usize,
    #[comptime] ks: usize,
    #[define(F)] _input: StorageType,
    #[define(S)] _stage: StorageType,
) {
    let seq = q.shape(2);
    let tile = (seq + TILE - 1) / TILE - 1 - CUBE_POS_Y as usize;
    let (head, batch) = (CUBE_POS_X as usize, CUBE_POS_Z as usize);
    let kv_head = head / (q.shape(1) / k.shape(1));
    let (plane, lane) = (UNIT_POS_Y as usize, UNIT_POS_X as usize);
    let first = tile * TILE;
    let ld = comptime!(dim + PAD);
    let lp = comptime!(TILE + PAD);
    // f32 rows: the scores (TILE wide) or the output (dim wide).
    let lw = comptime!((if dim > TILE { dim } else { TILE }) + PAD);

    let mut qs = SharedMemory::<S>::new(comptime!(TILE * (dim + PAD)));
    let mut ks_ = SharedMemory::<S>::new(comptime!(TILE * (dim + PAD)));
    let mut vs = SharedMemory::<S>::new(comptime!(TILE * (dim + PAD)));
    let mut ps = SharedMemory::<S>::new(comptime!(TILE * (TILE + PAD)));
    let mut scratch = SharedMemory::<f32>::new(comptime!(
        TILE * ((if dim > TILE { dim } else { TILE }) + PAD)
    ));
    let k_base = batch * k.stride(0) + kv_head * k.stride(1);
    let v_base = batch * v.stride(0) + kv_head * v.stride(1);
    let (k_row, k_col, v_row, v_col) = (k.stride(2), k.stride(3), v.stride(2), v.stride(3));
    load_rows::<F, S>(
        q,
        &mut qs,
        batch * q.stride(0) + head * q.stride(1),
        q.stride(2),
        q.stride(3),
        seq,
        first,
        dim,
    );
    sync_cube();
    let q_frags = row_fragments::<S>(&qs, plane * 16 * ld, dim, ks);

    // Two lanes a row: lane `2r + h` holds row `r`'s state and its
    // columns `2c + h`.
    let (row, half) = (lane / 2, lane % 2);
    let query = first + plane * 16 + row;
    let mut limit = query + 1;
    if limit > seq {
        limit = seq;
    }
    // The row sees keys from `query + 1 − window` on; the cube's first
    // query, keys from `first + 1 − window` (tiles before that are skipped).
    let window = window as usize;
    let earliest = visible_columns(query + 1, window);
    let first_tile = visible_columns(first + 1, window) / TILE;
    let mine = plane * 16 * lw;
    let my_scores = mine + row * lw;
    let my_probs = (plane * 16 + row) * lp;
    // The running maximum and sum of the row.
    let (mut max, mut sum) = (f32::new(LOWEST), f32::new(0.0));
    let acc = zeros(dim, ks);
    let mut last = first + TILE;
    if last > seq {
        last = seq;
    }
    let key_tiles = (last + TILE - 1) / TILE;
    let mut j = first_tile;
    while j < key_tiles {
        let first_key = j * TILE;
        sync_cube();
        load_rows::<F, S>(k, &mut ks_, k_base, k_row, k_col, seq, first_key, dim);
        load_rows::<F, S>(v, &mut vs, v_base, v_row, v_col, seq, first_key, dim);
        sync_cube();
        product_transposed::<S>(&q_frags, &ks_, &mut scratch, mine, lw as u32, dim, ks);
        sync_plane();
        let visible = visible_columns(limit, first_key);
        let before = visible_columns(earliest, first_key);
        let mut tile_max = f32::new(LOWEST);
        #[unroll]
        for c in 0..comptime!(TILE / 2) {
            let col = rotated(c, row, half, TILE);
            let s = scratch[my_scores + col] * scale;
            if col >= before && col < visible && s > tile_max {
                tile_max = s;
            }
        }
        let other = plane_shuffle_xor(tile_max, 1);
        if other > tile_max {
            tile_max = other;
        }
        let mut new_max = max;
        if tile_max > new_max {
            new_max = tile_max;
        }
        let alpha = (max - new_max).exp();
        let mut tile_sum = f32::new(0.0);
        #[unroll]
        for c in 0..comptime!(TILE / 2) {
            let col = rotated(c, row, half, TILE);
            let mut p = f32::new(0.0);
            if col >= before && col < visible {
                p = (scratch[my_scores + col] * scale - new_max).exp();
            }
            tile_sum += p;
            ps[my_probs + col] = S::cast_from(p);
        }
        tile_sum += plane_shuffle_xor(tile_sum, 1);
        sum = sum * alpha + tile_sum;
        max = new_max;
        sync_plane();
        // Unless no row's maximum moved (most tiles past the first few).
        if j > first_tile && plane_any(alpha < f32::new(1.0)) {
            // The running output rescaled by the new maximum: through
            // shared memory, as WMMA fragments hide which lane holds
            // which row.
            spill(&acc, &mut scratch, mine, dim);
            sync_plane();
            #[unroll]
            for c in 0..comptime!(dim / 2) {
                let at = mine + row * ld + rotated(c, row, half, dim);
                scratch[at] = scratch[at] * alpha;
            }
            sync_plane();
            #[unroll]
            for n in 0..comptime!(dim / 16) {
                cmma::load_with_layout(
                    acc.index(n),
                    &scratch.slice(mine + n * 16, scratch.len()),
                    ld as u32,
                    cmma::MatrixLayout::RowMajor,
                );
            }
        }
        accumulate_product::<S>(&ps, &vs, &acc, plane * 16 * lp, dim, ks);
        j += 1;
    }

    sync_plane();
    spill(&acc, &mut scratch, mine, dim);
    sync_plane();
    #[unroll]
    for c in 0..comptime!(dim / 2) {
        let at = mine + row * ld + rotated(c, row, half, dim);
        scratch[at] = scratch[at] / sum;
    }
    if half == 0 && query < seq {
        lse[batch * lse.stride(0) + head * lse.stride(1) + query * lse.stride(2)] = max + sum.ln();
    }
    sync_plane();
    let out_base = batch * out.stride(0) + head * out.stride(1);
    let (out_row, out_col) = (out.stride(2), out.stride(3));
    write_rows::<F>(
        &scratch,
        out,
        mine,
        out_base,
        out_row,
        out_col,
        seq,
        first + plane * 16,
        1.0,
        dim,
    );
}

/// The backward: a cube per `TILE` keys of key/value head `CUBE_POS_X`
/// of sequence `CUBE_POS_Z`, over the group's query heads and the query
/// tiles at or past its keys. It sums `dk` and `dv` in registers and adds
/// each query tile's share of `dq` to the f32 sums `dq` (atomically:
/// every key tile adds to the same queries). `lse` and `dot = rowsum(do ⊙
/// o)` are f32 `[b, h, s, 1]`.
#[cube(launch_unchecked, fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
pub(super) fn backward_kernel<F: Float, S: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    grad: &Tensor<F>,
    lse: &Tensor<f32>,
    dot: &Tensor<f32>,
    dq: &mut Tensor<Atomic<f32>>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    scale: f32,
    window: u32,
    #[comptime] dim: usize,
    #[comptime] ks: usize,
    #[define(F)] _input: StorageType,
    #[define(S)] _stage: StorageType,
) {
    let seq = q.shape(2);
    let groups = q.shape(1) / k.shape(1);
    let (kv_head, batch) = (CUBE_POS_X as usize, CUBE_POS_Z as usize);
    let (plane, lane) = (UNIT_POS_Y as usize, UNIT_POS_X as usize);
    let first_key = CUBE_POS_Y as usize * TILE;
    let lp = comptime!(TILE + PAD);
    // Two f32 score-shaped tiles a plane (p, then dp), or one output.
    let half_scratch = comptime!(TILE * (TILE + PAD));
    let scratch_len = comptime!(if 2 * (TILE + PAD) > dim + PAD {
        2 * TILE * (TILE + PAD)
    } else {
        TILE * (dim + PAD)
    });

    let mut qs = SharedMemory::<S>::new(comptime!(TILE * (dim + PAD)));
    let mut gs = SharedMemory::<S>::new(comptime!(TILE * (dim + PAD)));
    let mut ks_ = SharedMemory::<S>::new(comptime!(TILE * (dim + PAD)));
    let mut ps = SharedMemory::<S>::new(comptime!(TILE * (TILE + PAD)));
    let mut lses = SharedMemory::<f32>::new(TILE);
    let mut dots = SharedMemory::<f32>::new(TILE);
    let mut scratch = SharedMemory::<f32>::new(scratch_len);
    // Strides read once (see `load_rows`).
    let (q_row, q_col, g_row, g_col) = (q.stride(2), q.stride(3), grad.stride(2), grad.stride(3));
    let (lse_row, dot_row) = (lse.stride(2), dot.stride(2));
    let (dq_row, dq_col) = (dq.stride(2), dq.stride(3));
    let (q_batch, q_head) = (batch * q.stride(0), q.stride(1));
    let (g_batch, g_head) = (batch * grad.stride(0), grad.stride(1));
    let (lse_batch, lse_head) = (batch * lse.stride(0), lse.stride(1));
    let (dot_batch, dot_head) = (batch * dot.stride(0), dot.stride(1));
    let (dq_batch, dq_head) = (batch * dq.stride(0), dq.stride(1));
    load_rows::<F, S>(
        k,
        &mut ks_,
        batch * k.stride(0) + kv_head * k.stride(1),
        k.stride(2),
        k.stride(3),
        seq,
        first_key,
        dim,
    );
    // The values are only read as the planes' fragments, before the loop:
    // they pass through the output gradient's tile, which saves a tile of
    // shared memory (three cubes fit an SM instead of two at width 64).
    load_rows::<F, S>(
        v,
        &mut gs,
        batch * v.stride(0) + kv_head * v.stride(1),
        v.stride(2),
        v.stride(3),
        seq,
        first_key,
        dim,
    );
    sync_cube();
    let k_frags = row_fragments::<S>(&ks_, plane * 16 * comptime!(dim + PAD), dim, ks);
    let v_frags = row_fragments::<S>(&gs, plane * 16 * comptime!(dim + PAD), dim, ks);

    let (row, half) = (lane / 2, lane % 2);
    let key = first_key + plane * 16 + row;
    let ld = comptime!(dim + PAD);
    let mine = plane * 16 * lp;
    let my_row = mine + row * lp;
    let dk_acc = zeros(dim, ks);
    let dv_acc = zeros(dim, ks);
    // The queries that see the cube's last key end at its position plus the
    // window (past it, no query tile sees the cube's keys).
    let window = window as usize;
    let mut query_tiles = (seq + TILE - 1) / TILE;
    let reach = (first_key + TILE - 1 + window + TILE - 1) / TILE;
    if reach < query_tiles {
        query_tiles = reach;
    }
    let mut g = 0usize;
    while g < groups {
        let head = kv_head * groups + g;
        let mut i = CUBE_POS_Y as usize;
        while i < query_tiles {
            let first = i * TILE;
            sync_cube();
            load_rows::<F, S>(
                q,
                &mut qs,
                q_batch + head * q_head,
                q_row,
                q_col,
                seq,
                first,
                dim,
            );
            load_rows::<F, S>(
                grad,
                &mut gs,
                g_batch + head * g_head,
                g_row,
                g_col,
                seq,
                first,
                dim,
            );
            // Past the end: p = exp(s − ∞) = 0.
            load_stats(
                lse,
                &mut lses,
                lse_batch + head * lse_head,
                lse_row,
                seq,
                first,
                f32::new(1.0e30),
            );
            load_stats(
                dot,
                &mut dots,
                dot_batch + head * dot_head,
                dot_row,
                seq,
                first,
                f32::new(0.0),
            );
            sync_cube();
            // sᵀ (keys × queries), then pᵀ in f32 and in the stage type.
            product_transposed::<S>(&k_frags, &qs, &mut scratch, mine, lp as u32, dim, ks);
            product_transposed::<S>(
                &v_frags,
                &gs,
                &mut scratch,
                half_scratch + mine,
                lp as u32,
                dim,
                ks,
            );
            sync_plane();
            // Queries before the key (columns before `hidden`) do not see
            // it, nor those past its window (columns from `seen` on).
            let hidden = visible_columns(key, first);
            let seen = visible_columns(key + window, first);
            #[unroll]
            for c in 0..comptime!(TILE / 2) {
                let col = rotated(c, row, half, TILE);
                let at = my_row + col;
                let mut p = f32::new(0.0);
                if col >= hidden && col < seen {
                    p = (scratch[at] * scale - lses[col]).exp();
                }
                scratch[at] = p;
                ps[at] = S::cast_from(p);
            }
            sync_plane();
            accumulate_product::<S>(&ps, &gs, &dv_acc, mine, dim, ks);
            sync_plane();
            #[unroll]
            for c in 0..comptime!(TILE / 2) {
                let col = rotated(c, row, half, TILE);
                let at = my_row + col;
                let ds = scratch[at] * (scratch[half_scratch + at] - dots[col]);
                ps[at] = S::cast_from(ds);
            }
            sync_plane();
            accumulate_product::<S>(&ps, &qs, &dk_acc, mine, dim, ks);
            // The tile's queries' share of dq, ds·k over the cube's keys:
            // a plane per 16 queries, their ds the columns of every
            // plane's dsᵀ (column-major A fragments).
            sync_cube();
            let dq_part = zeros(dim, ks);
            #[unroll]
            for kk in 0..comptime!(TILE / ks) {
                let x = cmma::Matrix::<S>::from_slice(
                    cmma::MatrixIdent::A,
                    16usize,
                    16usize,
                    ks,
                    cmma::MatrixLayout::ColMajor,
                    &ps.slice(kk * ks * lp + plane * 16, ps.len()),
                    lp as u32,
                );
                #[unroll]
                for n in 0..comptime!(dim / 16) {
                    let y = cmma::Matrix::<S>::from_slice(
                        cmma::MatrixIdent::B,
                        16usize,
                        16usize,
                        ks,
                        cmma::MatrixLayout::RowMajor,
                        &ks_.slice(kk * ks * ld + n * 16, ks_.len()),
                        ld as u32,
                    );
                    cmma::execute::<S, S, f32, f32>(&x, &y, dq_part.index(n), dq_part.index(n));
                }
            }
            spill(&dq_part, &mut scratch, plane * 16 * ld, dim);
            sync_plane();
            add_rows(
                &scratch,
                dq,
                plane * 16 * ld,
                dq_batch + head * dq_head,
                dq_row,
                dq_col,
                seq,
                first + plane * 16,
                dim,
            );
            i += 1;
        }
        g += 1;
    }
    let out = plane * 16 * ld;
    sync_cube();
    spill(&dk_acc, &mut scratch, out, dim);
    sync_plane();
    write_rows::<F>(
        &scratch,
        dk,
        out,
        batch * dk.stride(0) + kv_head * dk.stride(1),
        dk.stride(2),
        dk.stride(3),
        seq,
        first_key + plane * 16,
        scale,
        dim,
    );
    sync_plane();
    spill(&dv_acc, &mut scratch, out, dim);
    sync_plane();
    write_rows::<F>(
        &scratch,
        dv,
        out,
        batch * dv.stride(0) + kv_head * dv.stride(1),
        dv.stride(2),
        dv.stride(3),
        seq,
        first_key + plane * 16,
        1.0,
        dim,
    );
}
