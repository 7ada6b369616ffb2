//! The fused kernels for bf16 and f16 on `mma.sync` (16×8×16), with the
//! scores in registers as FlashAttention-2 keeps them.
//!
//! A plane's product leaves lane `l` holding rows `g = l / 4` and `g + 8` of
//! its 16, columns `2t` and `2t + 1` (`t = l % 4`) of every 8-column block:
//! the place where the next product wants them as its left operand. So the
//! scores, probabilities and their gradients never leave the registers
//! (only the backward's `dsᵀ` goes through shared memory, transposed, for
//! `dq`). Operands come from shared memory through `ldmatrix`, which also
//! transposes. Register fragments are flat arrays of pairs indexed by
//! constants (registers after unrolling): a left operand is 4 pairs, a right
//! operand 2, an accumulator 2 (rows `g` and `g + 8`).
// Kernel code: cubecl's integers have no `div_ceil`.
#![allow(clippy::manual_div_ceil)]

use cubecl::cmma::MmaDefinition;
use cubecl::ir::{FastMath, MatrixIdent};
use cubecl::prelude::*;

use super::kernels::{visible_columns, LOWEST, PAD, TILE};
use super::tiles::{fetch, load_octets, stash, Octet};

/// Two consecutive values of a row: one 32-bit register of bf16 or f16, or
/// two of f32 (an accumulator's).
pub(super) type Pair<E> = Vector<E, Const<2>>;

/// Above every masked score, below every real one: a row whose keys are all
/// masked so far keeps [`LOWEST`] as its maximum and must not take
/// `exp(LOWEST − LOWEST) = 1` for them.
const MASKED_BELOW: f32 = -1.0e29;

/// Four 8×8 matrices of `tile` (rows `ld` apart) through `ldmatrix`: lane
/// `l` gives the address of its row, at `row`, `col`, of matrix `l / 8`;
/// `transpose` hands each lane a column's values instead of a row's.
#[cube]
pub(super) fn ldmatrix<F: Float>(
    tile: &SharedMemory<F>,
    row: usize,
    col: usize,
    #[comptime] ld: usize,
    #[comptime] transpose: bool,
) -> Array<Pair<F>> {
    let def = MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    let at = row * ld + col;
    def.load_matrix::<F, Const<2>>(&tile.slice(at, at + 8), MatrixIdent::A, 4usize, transpose)
}

/// `c[c_at..c_at + 2] += a[a_at..a_at + 4] · b[b_at..b_at + 2]`: one
/// 16×8×16 product on fragments held in larger arrays.
#[cube]
fn mma<F: Float>(
    a: &Array<Pair<F>>,
    #[comptime] a_at: usize,
    b: &Array<Pair<F>>,
    #[comptime] b_at: usize,
    c: &mut Array<Pair<f32>>,
    #[comptime] c_at: usize,
) {
    let def = MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    let mut fa = Array::<Pair<F>>::new(4usize);
    #[unroll]
    for i in 0..4usize {
        fa[i] = a[comptime!(a_at + i)];
    }
    let mut fb = Array::<Pair<F>>::new(2usize);
    fb[0] = b[b_at];
    fb[1] = b[comptime!(b_at + 1)];
    let mut fc = Array::<Pair<f32>>::new(2usize);
    fc[0] = c[c_at];
    fc[1] = c[comptime!(c_at + 1)];
    def.execute_inplace(&fa, &fb, &mut fc);
    c[c_at] = fc[0];
    c[comptime!(c_at + 1)] = fc[1];
}

/// `len` zeroed pairs of f32.
#[cube]
pub(super) fn zeros(#[comptime] len: usize) -> Array<Pair<f32>> {
    let mut acc = Array::<Pair<f32>>::new(len);
    #[unroll]
    for i in 0..len {
        acc[i] = Pair::<f32>::new(0.0);
    }
    acc
}

/// The plane's `16 · blocks` rows from `row` of `width` columns of `tile`
/// as left operands: block `b`'s 16 rows are the `width / 4` pairs from
/// `b · width / 4` on (4 pairs for each 16 columns).
#[cube]
pub(super) fn left_operands<F: Float>(
    tile: &SharedMemory<F>,
    row: usize,
    #[comptime] blocks: usize,
    #[comptime] width: usize,
    #[comptime] ld: usize,
) -> Array<Pair<F>> {
    let lane = UNIT_POS_X as usize;
    let mut frag = Array::<Pair<F>>::new(comptime!(blocks * width / 4));
    #[unroll]
    for b in 0..blocks {
        #[unroll]
        for kk in 0..comptime!(width / 16) {
            let regs = ldmatrix::<F>(
                tile,
                row + comptime!(16 * b) + lane % 16,
                comptime!(kk * 16) + (lane / 16) * 8,
                ld,
                false,
            );
            #[unroll]
            for i in 0..4usize {
                frag[comptime!(b * width / 4 + 4 * kk + i)] = regs[i];
            }
        }
    }
    frag
}

/// `a · tileᵀ` for the plane's left operands `a` (`blocks` of 16 rows of
/// `dim` columns, as [`left_operands`] holds them) and the `cols` rows of
/// `tile` from row `from` on (the right operand's columns): each block's
/// 16 × `cols` scores as `cols / 8` accumulators, block after block. Each
/// right operand read from shared memory serves every block.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn times_transposed<F: Float>(
    a: &Array<Pair<F>>,
    tile: &SharedMemory<F>,
    from: usize,
    #[comptime] blocks: usize,
    #[comptime] cols: usize,
    #[comptime] dim: usize,
    #[comptime] ld: usize,
) -> Array<Pair<f32>> {
    let lane = UNIT_POS_X as usize;
    let mut s = zeros(comptime!(blocks * 2 * cols / 8));
    #[unroll]
    for kk in 0..comptime!(dim / 16) {
        #[unroll]
        for nb in 0..comptime!(cols / 16) {
            // Matrices: rows 0–7 and 8–15 of the 16, each at columns 0–7
            // and 8–15 of the step: the right operands of two 8-row blocks.
            let b = ldmatrix::<F>(
                tile,
                from + comptime!(nb * 16) + lane % 8 + (lane / 16) * 8,
                comptime!(kk * 16) + ((lane / 8) % 2) * 8,
                ld,
                false,
            );
            #[unroll]
            for blk in 0..blocks {
                let (a_at, s_at) = comptime!((blk * dim / 4 + 4 * kk, blk * cols / 4 + 4 * nb));
                mma::<F>(a, a_at, &b, 0usize, &mut s, s_at);
                mma::<F>(a, a_at, &b, 2usize, &mut s, comptime!(s_at + 2));
            }
        }
    }
    s
}

/// `acc += a · tile` for left operands `a` (`blocks` of 16 rows of `rows`
/// columns, as [`as_left`] gives them) and the `rows` rows of `dim` columns
/// of `tile` from row `from` on; block `b`'s sums are the `dim / 4` pairs
/// of `acc` from `b · dim / 4` on.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate<F: Float>(
    a: &Array<Pair<F>>,
    tile: &SharedMemory<F>,
    from: usize,
    acc: &mut Array<Pair<f32>>,
    #[comptime] blocks: usize,
    #[comptime] rows: usize,
    #[comptime] dim: usize,
    #[comptime] ld: usize,
) {
    let lane = UNIT_POS_X as usize;
    #[unroll]
    for kk in 0..comptime!(rows / 16) {
        #[unroll]
        for nd in 0..comptime!(dim / 16) {
            // Transposed: rows 0–15 of the step at columns 0–7, then 8–15.
            let b = ldmatrix::<F>(
                tile,
                from + comptime!(kk * 16) + lane % 16,
                comptime!(nd * 16) + (lane / 16) * 8,
                ld,
                true,
            );
            #[unroll]
            for blk in 0..blocks {
                let (a_at, c_at) = comptime!((blk * rows / 4 + 4 * kk, blk * dim / 4 + 4 * nd));
                mma::<F>(a, a_at, &b, 0usize, acc, c_at);
                mma::<F>(a, a_at, &b, 2usize, acc, comptime!(c_at + 2));
            }
        }
    }
}

/// Accumulator pairs `s` (rows `g`, `g + 8` of `cols / 8` column blocks)
/// as left operands: block `n`'s pairs are the `n % 2` half of step `n / 2`.
#[cube]
pub(super) fn as_left<F: Float>(s: &Array<Pair<f32>>, #[comptime] cols: usize) -> Array<Pair<F>> {
    let mut a = Array::<Pair<F>>::new(comptime!(2 * cols / 8));
    #[unroll]
    for n in 0..comptime!(cols / 8) {
        #[unroll]
        for h in 0..2usize {
            a[comptime!(4 * (n / 2) + 2 * (n % 2) + h)] =
                Pair::<F>::cast_from(s[comptime!(2 * n + h)]);
        }
    }
    a
}

/// The larger of `x` and the values of the lane's quad (the four lanes of
/// a row).
#[cube]
fn quad_max(x: f32) -> f32 {
    let m = f32::max(x, plane_shuffle_xor(x, 1));
    f32::max(m, plane_shuffle_xor(m, 2))
}

/// The sum of `x` over the lane's quad.
#[cube]
fn quad_sum(x: f32) -> f32 {
    let s = x + plane_shuffle_xor(x, 1);
    s + plane_shuffle_xor(s, 2)
}

/// Where the forward's lane keeps row `r` of its `2 · blocks` (rows `g`
/// and `g + 8` of each block of 16) in accumulators of `width` columns:
/// block `r / 2`'s pairs start at `(r / 2) · width / 4`, and the row's are
/// every other one of them from `r % 2` on.
fn row_pairs(r: usize, width: usize) -> (usize, usize) {
    ((r / 2) * width / 4, r % 2)
}

/// Sets to [`LOWEST`] the scores `s` (as the forward's `times_transposed`
/// left them: `blocks` of 16 rows, the lane's first row `row`) of the keys
/// from `first_key` on that their row must not see: past the row itself or
/// the sequence's end (`seq`), or before the row's `window`.
#[cube]
fn mask_scores(
    s: &mut Array<Pair<f32>>,
    row: usize,
    first_key: usize,
    seq: usize,
    window: usize,
    #[comptime] blocks: usize,
) {
    let t = UNIT_POS_X as usize % 4;
    #[unroll]
    for r in 0..comptime!(2 * blocks) {
        let (base, h) = comptime!(row_pairs(r, TILE));
        let mine = row + comptime!(8 * r);
        let end = select(mine + 1 < seq, mine + 1, seq);
        let start = visible_columns(mine + 1, window);
        #[unroll]
        for n in 0..comptime!(TILE / 8) {
            let mut x = s[comptime!(base + 2 * n + h)];
            #[unroll]
            for e in 0..2usize {
                let key = first_key + comptime!(8 * n + e) + 2 * t;
                x[e] = select(key >= start && key < end, x[e], f32::new(LOWEST));
            }
            s[comptime!(base + 2 * n + h)] = x;
        }
    }
}

/// The forward for bf16 and f16 (see `forward_kernel`): a cube per
/// `TILE · blocks` queries (the last tiles first) of head `CUBE_POS_X` of
/// sequence `CUBE_POS_Z`; each plane's `16 · blocks` rows keep their
/// scores, probabilities and output in registers. With two blocks a plane
/// (heads of 64) each key and value fragment read from shared memory feeds
/// two products, where with one the reads bound the kernel.
#[cube(launch_unchecked, fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
pub(super) fn forward_mma_kernel<F: Float>(
    q: &Tensor<Octet<F>>,
    k: &Tensor<Octet<F>>,
    v: &Tensor<Octet<F>>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    scale: f32,
    window: u32,
    #[comptime] dim: usize,
    #[comptime] blocks: usize,
    #[define(F)] _input: StorageType,
) {
    let queries = comptime!(TILE * blocks);
    let seq = q.shape(2);
    let tile = (seq + queries - 1) / queries - 1 - CUBE_POS_Y as usize;
    let (head, batch) = (CUBE_POS_X as usize, CUBE_POS_Z as usize);
    let kv_head = head / (q.shape(1) / k.shape(1));
    let (plane, lane) = (UNIT_POS_Y as usize, UNIT_POS_X as usize);
    let t = lane % 4;
    let first = tile * queries;
    let ld = comptime!(dim + PAD);
    let window = window as usize;

    let mut qs = SharedMemory::<F>::new_aligned(comptime!(queries * (dim + PAD)), 16usize);
    // Two tiles each: the products read one while the next key tile's
    // values go into the other (see the loop).
    let mut ks_ = SharedMemory::<F>::new_aligned(comptime!(2 * TILE * (dim + PAD)), 16usize);
    let mut vs = SharedMemory::<F>::new_aligned(comptime!(2 * TILE * (dim + PAD)), 16usize);
    let k_base = batch * k.stride(0) + kv_head * k.stride(1);
    let v_base = batch * v.stride(0) + kv_head * v.stride(1);
    let (k_row, v_row) = (k.stride(2), v.stride(2));
    #[unroll]
    for b in 0..blocks {
        load_octets::<F>(
            q,
            &mut qs,
            comptime!(b * TILE),
            batch * q.stride(0) + head * q.stride(1),
            q.stride(2),
            seq,
            first + comptime!(b * TILE),
            dim,
        );
    }
    let mut last = first + queries;
    if last > seq {
        last = seq;
    }
    let key_tiles = (last + TILE - 1) / TILE;
    let first_tile = visible_columns(first + 1, window) / TILE;
    load_octets::<F>(
        k,
        &mut ks_,
        0usize,
        k_base,
        k_row,
        seq,
        first_tile * TILE,
        dim,
    );
    load_octets::<F>(
        v,
        &mut vs,
        0usize,
        v_base,
        v_row,
        seq,
        first_tile * TILE,
        dim,
    );
    sync_cube();
    let q_frag = left_operands::<F>(&qs, plane * comptime!(16 * blocks), blocks, dim, ld);

    // The lane's rows: `row + 8 · r` for `r` in `0..2 · blocks` (the
    // accumulators' rows `g` and `g + 8` of each block).
    let row = first + plane * comptime!(16 * blocks) + lane / 4;
    let rows = comptime!(2 * blocks);
    let mut max = Array::<f32>::new(rows);
    // The lane's share of each row's sum (the quad's are added at the end).
    let mut sum = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        max[r] = f32::new(LOWEST);
        sum[r] = f32::new(0.0);
    }
    let mut o = zeros(comptime!(blocks * 2 * dim / 8));
    // Tile `j` is in rows `now..now + TILE` of `ks_` and `vs`; tile `j + 1`
    // goes into the other `TILE` rows, so the products on tile `j` run
    // while its loads are under way: the keys' issue before the scores'
    // product and are stored once the probabilities are rounded, the
    // values' issue then (registers for them and the scores at once would
    // crowd heads of 128) and are stored after the output's product. One
    // sync a tile: the rows stored in iteration `j` are read in `j + 1`,
    // past it, and were last read in `j − 1`, before the previous one.
    let mut now = 0usize;
    let mut j = first_tile;
    while j < key_tiles {
        let first_key = j * TILE;
        let next = TILE - now;
        // The last tile loads itself again (in bounds, stored where
        // nothing reads it): no branch.
        let next_key = select(j + 1 < key_tiles, first_key + TILE, first_key);
        let k_next = fetch::<F>(k, k_base, k_row, seq, next_key, dim);
        let mut s = times_transposed::<F>(&q_frag, &ks_, now, blocks, TILE, dim, ld);
        // Whether some row of the cube must not see some key of the tile:
        // the diagonal, the window's start, or the sequence's end.
        let masks = first_key + TILE > first + 1
            || first_key + window < first + queries
            || first_key + TILE > seq;
        // One branch a tile: most tiles mask nothing, and their scores
        // then take no selects.
        if masks {
            mask_scores(&mut s, row, first_key, seq, window, blocks);
        }
        #[unroll]
        for r in 0..rows {
            // Row `r`'s pairs: half `r % 2` of block `r / 2`'s. The maxima
            // are of the unscaled scores (the scale is positive), which
            // the exponent's one fused multiply-add then scales.
            let (base, h) = comptime!(row_pairs(r, TILE));
            let mut m = f32::new(LOWEST);
            #[unroll]
            for n in 0..comptime!(TILE / 8) {
                let x = s[comptime!(base + 2 * n + h)];
                m = f32::max(m, f32::max(x[0], x[1]));
            }
            let new_max = f32::max(max[r], quad_max(m));
            let alpha = ((max[r] - new_max) * scale).exp();
            max[r] = new_max;
            let shift = select(new_max > MASKED_BELOW, new_max * scale, f32::new(0.0));
            let mut tile_sum = f32::new(0.0);
            #[unroll]
            for n in 0..comptime!(TILE / 8) {
                let mut x = s[comptime!(base + 2 * n + h)];
                #[unroll]
                for e in 0..2usize {
                    x[e] = fma(x[e], scale, -shift).exp();
                    tile_sum += x[e];
                }
                s[comptime!(base + 2 * n + h)] = x;
            }
            sum[r] = fma(sum[r], alpha, tile_sum);
            let o_base = comptime!(row_pairs(r, dim).0);
            #[unroll]
            for nd in 0..comptime!(dim / 8) {
                o[comptime!(o_base + 2 * nd + h)] =
                    o[comptime!(o_base + 2 * nd + h)] * Pair::<f32>::new(alpha);
            }
        }
        let p = as_left::<F>(&s, queries);
        stash::<F>(&k_next, &mut ks_, next, seq, next_key, dim);
        let v_next = fetch::<F>(v, v_base, v_row, seq, next_key, dim);
        accumulate::<F>(&p, &vs, now, &mut o, blocks, TILE, dim, ld);
        stash::<F>(&v_next, &mut vs, next, seq, next_key, dim);
        sync_cube();
        now = next;
        j += 1;
    }

    let out_base = batch * out.stride(0) + head * out.stride(1);
    let (out_row, out_col) = (out.stride(2), out.stride(3));
    let lse_base = batch * lse.stride(0) + head * lse.stride(1);
    #[unroll]
    for r in 0..rows {
        let (o_base, h) = comptime!(row_pairs(r, dim));
        let mine = row + comptime!(8 * r);
        let total = quad_sum(sum[r]);
        #[unroll]
        for nd in 0..comptime!(dim / 8) {
            let a = o[comptime!(o_base + 2 * nd + h)];
            #[unroll]
            for e in 0..2usize {
                let col = comptime!(8 * nd + e) + 2 * t;
                if mine < seq {
                    out[out_base + mine * out_row + col * out_col] = F::cast_from(a[e] / total);
                }
            }
        }
        if t == 0 && mine < seq {
            lse[lse_base + mine * lse.stride(2)] = fma(max[r], scale, total.ln());
        }
    }
}
