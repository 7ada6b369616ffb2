//! Row math on host slices: parallel copy/add/widen of gradient values and
//! the embedding table's gather and scatter-add by token.

use rayon::prelude::*;

/// Writes `values` over `out`, or adds them with `accumulate`, in parallel:
/// a block's gradients are hundreds of megabytes, and on a GPU the device
/// waits for the next block's work while this runs.
pub fn write_into(out: &mut [f32], values: &[f32], accumulate: bool) {
    let pairs = chunk_pairs(out, values);
    if accumulate {
        pairs.for_each(|(o, v)| o.iter_mut().zip(v).for_each(|(o, v)| *o += v));
    } else {
        pairs.for_each(|(o, v)| o.copy_from_slice(v));
    }
}

/// [`write_into`], returning the sum of squares of what `out` holds after
/// (in f64, as [`super::norm::sum_of_squares`]) from the same pass.
pub fn write_into_sum_sq(out: &mut [f32], values: &[f32], accumulate: bool) -> f64 {
    chunk_pairs(out, values)
        .map(|(o, v)| {
            o.iter_mut()
                .zip(v)
                .map(|(o, v)| {
                    *o = if accumulate { *o + v } else { *v };
                    (*o as f64) * (*o as f64)
                })
                .sum::<f64>()
        })
        .sum()
}

pub fn chunk_pairs<'a, T: Sync>(
    out: &'a mut [f32],
    values: &'a [T],
) -> impl IndexedParallelIterator<Item = (&'a mut [f32], &'a [T])> {
    const CHUNK: usize = 1 << 16;
    assert_eq!(
        out.len(),
        values.len(),
        "host range and values differ in length"
    );
    out.par_chunks_mut(CHUNK).zip(values.par_chunks(CHUNK))
}
