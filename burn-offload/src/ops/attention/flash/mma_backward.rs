//! The `mma.sync` backward for bf16 and f16 with heads of at most 64 values
//! (see `backward_kernel` for the math; the fragments are `mma`'s).
//!
//! A cube owns [`BACKWARD_KEYS`] keys of one key/value head, 32 a plane in
//! two blocks of 16: every fragment of queries and output gradients read
//! from shared memory feeds a product for each block, which halves the
//! shared-memory reads a product against 16 keys a plane (those reads bound
//! the kernel). The blocks' fragments of `k` and `v` and their sums `dk`,
//! `dv` then take most of a unit's registers, so the next query tile comes
//! in through `cp.async` rather than through registers.
// Kernel code: cubecl's integers have no `div_ceil`.
#![allow(clippy::manual_div_ceil)]

use cubecl::ir::FastMath;
use cubecl::prelude::barrier::Barrier;
use cubecl::prelude::*;

use super::kernels::{PAD, PLANES, TILE};
use super::mma::{accumulate, as_left, ldmatrix, left_operands, times_transposed, zeros, Pair};
use super::tiles::{copy_octets, fetch_stat, load_octets, stash_stat, Octet};

/// Blocks of 16 keys each plane holds.
const KEY_BLOCKS: usize = 2;

/// Keys a cube of the backward owns.
pub(super) const BACKWARD_KEYS: usize = 16 * KEY_BLOCKS * PLANES;

/// Sets to zero the probabilities `pᵀ` (block `at / 4` of the backward's:
/// 16 keys, the lane's first `key`, × the 16 queries from `first_query` on)
/// of the queries that must not see their key: before it, or past its
/// `window`.
#[cube]
fn mask_probabilities(
    s: &mut Array<Pair<f32>>,
    #[comptime] at: usize,
    key: usize,
    first_query: usize,
    window: usize,
) {
    let t = UNIT_POS_X as usize % 4;
    #[unroll]
    for n in 0..2usize {
        #[unroll]
        for h in 0..2usize {
            let mine = key + comptime!(8 * h);
            let mut p = s[comptime!(at + 2 * n + h)];
            #[unroll]
            for e in 0..2usize {
                let query = first_query + comptime!(8 * n + e) + 2 * t;
                p[e] = select(query >= mine && query < mine + window, p[e], f32::new(0.0));
            }
            s[comptime!(at + 2 * n + h)] = p;
        }
    }
}

/// The backward: a cube per [`BACKWARD_KEYS`] keys of key/value head
/// `CUBE_POS_X` of sequence `CUBE_POS_Z`, each plane's 32 keys keeping
/// their fragments of `k` and `v`, `sᵀ`, `dpᵀ`, and the sums `dk`, `dv` in
/// registers. `dsᵀ` goes through shared memory once a query tile: each
/// plane then adds its 16 queries' `ds·k` to the f32 sums `dq` atomically.
#[cube(launch_unchecked, fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
pub(super) fn backward_mma_kernel<F: Float>(
    q: &Tensor<Octet<F>>,
    k: &Tensor<Octet<F>>,
    v: &Tensor<Octet<F>>,
    grad: &Tensor<Octet<F>>,
    lse: &Tensor<f32>,
    dot: &Tensor<f32>,
    dq: &mut Tensor<Atomic<Pair<f32>>>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    scale: f32,
    window: u32,
    #[comptime] dim: usize,
    #[define(F)] _input: StorageType,
) {
    let seq = q.shape(2);
    let groups = q.shape(1) / k.shape(1);
    let (kv_head, batch) = (CUBE_POS_X as usize, CUBE_POS_Z as usize);
    let (plane, lane) = (UNIT_POS_Y as usize, UNIT_POS_X as usize);
    let t = lane % 4;
    let keys = comptime!(BACKWARD_KEYS);
    let first_key = CUBE_POS_Y as usize * keys;
    let ld = comptime!(dim + PAD);
    let lp = comptime!(TILE + PAD);
    let window = window as usize;

    // Two tiles of the queries, output gradients and their statistics:
    // the products read one while the next query tile comes into the
    // other (see the loop).
    let mut qs = SharedMemory::<F>::new_aligned(comptime!(2 * TILE * (dim + PAD)), 16usize);
    let mut gs = SharedMemory::<F>::new_aligned(comptime!(2 * TILE * (dim + PAD)), 16usize);
    let mut ks_ = SharedMemory::<F>::new_aligned(comptime!(keys * (dim + PAD)), 16usize);
    // `dsᵀ` (the cube's keys × a query tile); before the loop, the values
    // (rows `dim + PAD` apart, which a head of at most 64 fits).
    let mut dst = SharedMemory::<F>::new_aligned(comptime!(keys * (TILE + PAD)), 16usize);
    let mut lses = SharedMemory::<f32>::new(comptime!(2 * TILE));
    let mut dots = SharedMemory::<f32>::new(comptime!(2 * TILE));
    // Completes once every unit has arrived and its copies have landed.
    let landed = Barrier::shared(CUBE_DIM, UNIT_POS == 0);
    // Strides read once (see `load_rows`).
    let (q_row, g_row) = (q.stride(2), grad.stride(2));
    let (lse_row, dot_row) = (lse.stride(2), dot.stride(2));
    let dq_row = dq.stride(2);
    let (q_batch, q_head) = (batch * q.stride(0), q.stride(1));
    let (g_batch, g_head) = (batch * grad.stride(0), grad.stride(1));
    let (lse_batch, lse_head) = (batch * lse.stride(0), lse.stride(1));
    let (dot_batch, dot_head) = (batch * dot.stride(0), dot.stride(1));
    let (dq_batch, dq_head) = (batch * dq.stride(0), dq.stride(1));
    let k_base = batch * k.stride(0) + kv_head * k.stride(1);
    let v_base = batch * v.stride(0) + kv_head * v.stride(1);
    #[unroll]
    for part in 0..comptime!(keys / TILE) {
        let from = comptime!(part * TILE);
        let first = first_key + from;
        load_octets::<F>(k, &mut ks_, from, k_base, k.stride(2), seq, first, dim);
        load_octets::<F>(v, &mut dst, from, v_base, v.stride(2), seq, first, dim);
    }
    // The first query tile (of the group's first head): the first that
    // sees the cube's keys.
    let head_0 = kv_head * groups;
    let q_0 = q_batch + head_0 * q_head;
    load_octets::<F>(q, &mut qs, 0usize, q_0, q_row, seq, first_key, dim);
    let g_0 = g_batch + head_0 * g_head;
    load_octets::<F>(grad, &mut gs, 0usize, g_0, g_row, seq, first_key, dim);
    // Past the end: p = exp(s − 1e30) = 0.
    let lse_0 = fetch_stat(lse, lse_batch + head_0 * lse_head, lse_row, seq, first_key);
    let dot_0 = fetch_stat(dot, dot_batch + head_0 * dot_head, dot_row, seq, first_key);
    stash_stat(lse_0, &mut lses, 0usize, seq, first_key, f32::new(1.0e30));
    stash_stat(dot_0, &mut dots, 0usize, seq, first_key, f32::new(0.0));
    sync_cube();
    let own = plane * comptime!(16 * KEY_BLOCKS);
    let k_frag = left_operands::<F>(&ks_, own, KEY_BLOCKS, dim, ld);
    let v_frag = left_operands::<F>(&dst, own, KEY_BLOCKS, dim, ld);
    // Every plane has its values before the first `dsᵀ` overwrites them.
    sync_cube();

    // The lane's keys: `key + 16 · b + 8 · h` for block `b`, half `h`.
    let key = first_key + own + lane / 4;
    let mut dk_acc = zeros(comptime!(KEY_BLOCKS * 2 * dim / 8));
    let mut dv_acc = zeros(comptime!(KEY_BLOCKS * 2 * dim / 8));
    // The queries that see the cube's last key end at its position plus
    // the window.
    let mut query_tiles = (seq + TILE - 1) / TILE;
    let reach = (first_key + keys - 1 + window + TILE - 1) / TILE;
    if reach < query_tiles {
        query_tiles = reach;
    }
    // The query tile of iteration `j` is in rows `now..now + TILE` of `qs`
    // and `gs` (and of `lses`, `dots`); that of `j + 1` comes into the
    // other `TILE` rows while the products run, and has landed at the
    // iteration's end, where every unit waits for it. The products walk
    // the tile 16 queries at a time (`sᵀ`, `dpᵀ`, then `pᵀ`, `dsᵀ` and
    // their sums), so only a slice's scores are in registers beside the
    // cube's sums. Two waits a tile: on `dsᵀ`, and at the end, between the
    // rows written in iteration `j` and their reads in `j + 1` (they were
    // last read in `j − 1`, before the previous end).
    let mut now = 0usize;
    let mut g = 0usize;
    while g < groups {
        let head = head_0 + g;
        let mut i = first_key / TILE;
        while i < query_tiles {
            let first = i * TILE;
            let next = TILE - now;
            // The next tile: this head's next, else the next head's first
            // (the cube's own), else this one again (in bounds, written
            // where nothing reads it): no branch.
            let head_done = i + 1 >= query_tiles;
            let next_first = select(head_done, first_key, first + TILE);
            let next_head = select(head_done && g + 1 < groups, head + 1, head);
            let q_next = q_batch + next_head * q_head;
            copy_octets::<F>(q, &mut qs, next, q_next, q_row, seq, next_first, dim);
            let g_next = g_batch + next_head * g_head;
            copy_octets::<F>(grad, &mut gs, next, g_next, g_row, seq, next_first, dim);
            landed.commit_copy_async();
            let lse_base = lse_batch + next_head * lse_head;
            let lse_next = fetch_stat(lse, lse_base, lse_row, seq, next_first);
            let dot_base = dot_batch + next_head * dot_head;
            let dot_next = fetch_stat(dot, dot_base, dot_row, seq, next_first);
            // Whether some query of the tile must not see some key of the
            // cube: the diagonal or the window's end (queries past the
            // sequence's end have p = 0 through their log-sum-exp).
            let masks = first < first_key + keys - 1 || first + TILE > first_key + window;
            #[unroll]
            for slice in 0..comptime!(TILE / 16) {
                let from = now + comptime!(16 * slice);
                // The slice's statistics, each shared by the lane's rows.
                let mut lse_at = Array::<f32>::new(4usize);
                let mut dot_at = Array::<f32>::new(4usize);
                #[unroll]
                for c in 0..4usize {
                    let col = from + comptime!(8 * (c / 2) + c % 2) + 2 * t;
                    lse_at[c] = lses[col];
                    dot_at[c] = dots[col];
                }
                // sᵀ and dpᵀ (the plane's keys × the slice's queries),
                // then pᵀ and dsᵀ in place.
                let mut s = times_transposed::<F>(&k_frag, &qs, from, KEY_BLOCKS, 16usize, dim, ld);
                let mut dp =
                    times_transposed::<F>(&v_frag, &gs, from, KEY_BLOCKS, 16usize, dim, ld);
                #[unroll]
                for at in 0..comptime!(4 * KEY_BLOCKS) {
                    let n = comptime!((at % 4) / 2);
                    let mut p = s[at];
                    #[unroll]
                    for e in 0..2usize {
                        p[e] = fma(p[e], scale, -lse_at[comptime!(2 * n + e)]).exp();
                    }
                    s[at] = p;
                }
                // One branch a slice: most mask nothing.
                if masks {
                    #[unroll]
                    for b in 0..KEY_BLOCKS {
                        let first_query = first + comptime!(16 * slice);
                        let block_key = key + comptime!(16 * b);
                        mask_probabilities(
                            &mut s,
                            comptime!(4 * b),
                            block_key,
                            first_query,
                            window,
                        );
                    }
                }
                #[unroll]
                for at in 0..comptime!(4 * KEY_BLOCKS) {
                    let n = comptime!((at % 4) / 2);
                    let p = s[at];
                    let mut d = dp[at];
                    #[unroll]
                    for e in 0..2usize {
                        d[e] = p[e] * (d[e] - dot_at[comptime!(2 * n + e)]);
                    }
                    dp[at] = d;
                }
                // Block `b`'s 16 keys × 16 queries are pairs `4b..4b + 4`
                // of each, as left operands.
                let p = as_left::<F>(&s, comptime!(16 * KEY_BLOCKS));
                let ds = as_left::<F>(&dp, comptime!(16 * KEY_BLOCKS));
                // dsᵀ into shared memory, rows the cube's keys: the same
                // roundings of `dpᵀ` as the sums take.
                #[unroll]
                for at in 0..comptime!(4 * KEY_BLOCKS) {
                    let (b, n, h) = comptime!((at / 4, (at % 4) / 2, at % 2));
                    let d = ds[at];
                    let row = own + lane / 4 + comptime!(16 * b + 8 * h);
                    let col = comptime!(16 * slice + 8 * n) + 2 * t;
                    // One 4-byte store a pair (rows and `col` are even).
                    let mut pairs = dst
                        .slice_mut(0usize, dst.len())
                        .into_vectorized()
                        .with_vector_size::<Const<2>>();
                    pairs[(row * lp + col) / 2] = d;
                }
                accumulate::<F>(&p, &gs, from, &mut dv_acc, KEY_BLOCKS, 16usize, dim, ld);
                accumulate::<F>(&ds, &qs, from, &mut dk_acc, KEY_BLOCKS, 16usize, dim, ld);
            }
            sync_cube();
            // The plane's 16 queries' ds·k over the cube's keys, a tile of
            // keys at a time: ds as left operands, transposed out of dsᵀ.
            let mut dq_part = zeros(comptime!(2 * dim / 8));
            #[unroll]
            for part in 0..comptime!(keys / TILE) {
                let mut ds_rows = Array::<Pair<F>>::new(comptime!(4 * TILE / 16));
                #[unroll]
                for kk in 0..comptime!(TILE / 16) {
                    let regs = ldmatrix::<F>(
                        &dst,
                        comptime!(part * TILE + kk * 16) + lane % 8 + (lane / 16) * 8,
                        plane * 16 + ((lane / 8) % 2) * 8,
                        lp,
                        true,
                    );
                    #[unroll]
                    for r in 0..4usize {
                        ds_rows[comptime!(4 * kk + r)] = regs[r];
                    }
                }
                let from = comptime!(part * TILE);
                accumulate::<F>(&ds_rows, &ks_, from, &mut dq_part, 1usize, TILE, dim, ld);
            }
            // The lane's two rows of `dq` (contiguous rows: the launcher
            // allocates it), each of whose pairs is a constant offset from
            // the row's first, added as one 8-byte atomic (a quad's four
            // then cover a whole 32-byte sector of the row); rows past the
            // sequence's end only in its last tile.
            let query = first + plane * 16 + lane / 4;
            let at = (dq_batch + head * dq_head + query * dq_row) / 2 + t;
            let whole = first + TILE <= seq;
            #[unroll]
            for h in 0..2usize {
                if whole || query + comptime!(8 * h) < seq {
                    let row_at = at + comptime!(8 * h) * (dq_row / 2);
                    #[unroll]
                    for nd in 0..comptime!(dim / 8) {
                        dq[row_at + comptime!(4 * nd)].fetch_add(dq_part[comptime!(2 * nd + h)]);
                    }
                }
            }
            stash_stat(lse_next, &mut lses, next, seq, next_first, f32::new(1.0e30));
            stash_stat(dot_next, &mut dots, next, seq, next_first, f32::new(0.0));
            landed.arrive_and_wait();
            now = next;
            i += 1;
        }
        g += 1;
    }
    let dk_base = batch * dk.stride(0) + kv_head * dk.stride(1);
    let dv_base = batch * dv.stride(0) + kv_head * dv.stride(1);
    let (dk_row, dk_col, dv_row, dv_col) = (dk.stride(2), dk.stride(3), dv.stride(2), dv.stride(3));
    #[unroll]
    for b in 0..KEY_BLOCKS {
        #[unroll]
        for nd in 0..comptime!(dim / 8) {
            #[unroll]
            for h in 0..2usize {
                let at = comptime!(b * dim / 4 + 2 * nd + h);
                let (x, y) = (dk_acc[at], dv_acc[at]);
                let row = key + comptime!(16 * b + 8 * h);
                #[unroll]
                for e in 0..2usize {
                    let col = comptime!(8 * nd + e) + 2 * t;
                    let (dk_e, dv_e) = (F::cast_from(x[e] * scale), F::cast_from(y[e]));
                    if row < seq {
                        dk[dk_base + row * dk_row + col * dk_col] = dk_e;
                        dv[dv_base + row * dv_row + col * dv_col] = dv_e;
                    }
                }
            }
        }
    }
}
