//! Blockwise 8-bit quantisation of optimizer moments, bitsandbytes' scheme
//! for its 8-bit Adam: each block of [`QUANT_BLOCK`] values is scaled by its
//! largest magnitude (`absmax`) and each value stored as the index of the
//! nearest entry of a 256-entry *dynamic* map, whose entries are spaced by
//! decades (an exponent) with a linear fraction inside each, so small values
//! keep their relative precision. The first moment uses the signed map, the
//! second (never negative) the unsigned one, which spends the sign bit on
//! twice the fraction.

use std::sync::LazyLock;

/// Values per quantisation block (bitsandbytes' blockwise optimizers use 256).
pub const QUANT_BLOCK: usize = 256;

/// A sorted 256-entry dynamic quantisation map, with a lookup table from
/// a value's top 16 bits to the index of its nearest entry (or a neighbour's).
pub struct DynamicMap {
    /// The entries, ascending, within [-1, 1].
    pub values: [f32; 256],
    /// The midpoints between consecutive entries (the last is +∞): a value
    /// is coded as the entry whose interval between midpoints holds it.
    mids: [f32; 256],
    /// Indexed by the top 16 bits of an f32: the entry nearest to the middle
    /// of the range of f32 sharing those bits.
    guess: Vec<u8>,
}

/// bitsandbytes' `create_dynamic_map(signed, max_exponent_bits = 7,
/// total_bits = 8)`: for i in 0..7, the midpoints of `2^i` (signed) or
/// `2^(i+1)` (unsigned) equal steps of [0.1, 1], times 10^(i-6), with their
/// negatives when signed; then 0 and 1.
fn dynamic_values(signed: bool) -> [f32; 256] {
    const MAX_EXPONENT_BITS: i32 = 7;
    let mut data: Vec<f64> = Vec::with_capacity(256);
    for i in 0..MAX_EXPONENT_BITS {
        let items = if signed {
            1usize << i
        } else {
            1usize << (i + 1)
        };
        let scale = 10f64.powi(i - (MAX_EXPONENT_BITS - 1));
        // torch.linspace(0.1, 1, items + 1), in f32 as torch computes it.
        let step = (1.0 - 0.1) / items as f64;
        let boundary = |k: usize| (0.1 + step * k as f64) as f32 as f64;
        for k in 0..items {
            let mean = ((boundary(k) + boundary(k + 1)) / 2.0) as f32 as f64;
            data.push(scale * mean);
            if signed {
                data.push(-scale * mean);
            }
        }
    }
    data.push(0.0);
    data.push(1.0);
    assert_eq!(data.len(), 256, "a dynamic map has 256 entries");
    let mut values: Vec<f32> = data.into_iter().map(|v| v as f32).collect();
    values.sort_by(f32::total_cmp);
    values.try_into().expect("256 entries")
}

impl DynamicMap {
    fn new(signed: bool) -> Self {
        let values = dynamic_values(signed);
        let mut mids = [f32::INFINITY; 256];
        for c in 0..255 {
            mids[c] = (values[c] + values[c + 1]) / 2.0;
        }
        let guess = (0..1u32 << 16)
            .map(|top| {
                let mid = f32::from_bits((top << 16) | 0x8000);
                if mid.is_finite() {
                    nearest_by_search(&mids, mid.clamp(-1.0, 1.0))
                } else {
                    0
                }
            })
            .collect();
        Self {
            values,
            mids,
            guess,
        }
    }

    /// The index of the entry nearest to `x` (in [-1, 1]; at a midpoint, the
    /// lower), without a branch. The guess from `x`'s top bits is the
    /// nearest entry or a neighbour of it: entries are at least 1.4% apart,
    /// wider than the 0.8% that 16 bits leave of an f32, so at most one
    /// midpoint falls in a guess's range. Of the guess and its neighbours,
    /// the nearest is the lowest plus the midpoints between them below `x`.
    #[inline]
    pub fn nearest(&self, x: f32) -> u8 {
        let g = self.guess[(x.to_bits() >> 16) as usize] as usize;
        let lo = g.saturating_sub(1).min(253);
        lo as u8 + u8::from(x > self.mids[lo]) + u8::from(x > self.mids[lo + 1])
    }
}

/// The nearest entry by binary search over the midpoints `mids` (the number
/// of midpoints below `x`): the reference [`DynamicMap::nearest`] is built
/// from and tested against.
pub fn nearest_by_search(mids: &[f32; 256], x: f32) -> u8 {
    mids[..255].partition_point(|&m| m < x) as u8
}

/// The map of the first moment (signed).
pub static SIGNED: LazyLock<DynamicMap> = LazyLock::new(|| DynamicMap::new(true));
/// The map of the second moment (never negative).
pub static UNSIGNED: LazyLock<DynamicMap> = LazyLock::new(|| DynamicMap::new(false));

/// Quantises `values` (at most one block) into `codes`; returns the block's
/// scale, its largest magnitude (a block of zeros keeps scale 0 and codes of 0).
pub fn quantize_block(map: &DynamicMap, values: &[f32], codes: &mut [u8]) -> f32 {
    debug_assert!(values.len() <= QUANT_BLOCK && codes.len() == values.len());
    let absmax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let inv = if absmax > 0.0 { 1.0 / absmax } else { 0.0 };
    for (c, v) in codes.iter_mut().zip(values) {
        *c = map.nearest(v * inv);
    }
    absmax
}

/// Writes the values of one block's `codes` with scale `absmax` into `out`.
pub fn dequantize_block(map: &DynamicMap, codes: &[u8], absmax: f32, out: &mut [f32]) {
    debug_assert!(codes.len() <= QUANT_BLOCK && codes.len() == out.len());
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = map.values[c as usize] * absmax;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maps_are_bitsandbytes_dynamic_maps() {
        for (map, signed) in [(&*SIGNED, true), (&*UNSIGNED, false)] {
            let v = &map.values;
            assert!(v.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
            assert_eq!(v[255], 1.0);
            assert!(v.contains(&0.0));
            // The smallest non-zero magnitude: the first decade's first mean, 10⁻⁶ × 0.55
            // (signed: one item in [0.1, 1]), or × 0.325 (unsigned: two).
            let smallest = v
                .iter()
                .filter(|x| **x > 0.0)
                .fold(f32::MAX, |a, b| a.min(*b));
            let want = if signed { 0.55e-6 } else { 0.325e-6 };
            assert!((smallest - want).abs() < 1e-9, "{smallest}");
            // Signed: the negatives mirror the positives but for 1.
            assert_eq!(v[0], if signed { -v[254] } else { 0.0 });
        }
    }

    #[test]
    fn the_lookup_finds_the_nearest_entry() {
        for map in [&*SIGNED, &*UNSIGNED] {
            let lo = map.values[0];
            let mut x = lo;
            let mut n = 0;
            while x <= 1.0 {
                let want = nearest_by_search(&map.mids, x);
                assert_eq!(map.nearest(x), want, "{x:e}");
                // It is the nearest entry (at a midpoint, the lower).
                let dist = |c: u8| (map.values[c as usize] - x).abs();
                let neighbours = [want.saturating_sub(1), want.saturating_add(1)];
                assert!(neighbours.iter().all(|&c| dist(want) <= dist(c)), "{x:e}");
                // Walk with steps finer than the map everywhere, through every decade.
                x += (x.abs() * 1e-3).max(1e-9);
                n += 1;
            }
            assert!(n > 10_000);
        }
    }

    /// Quantise → dequantise moves each value by at most half the gap between
    /// the map's entries around it, times the block's absmax; the largest
    /// magnitude comes back exactly when it is positive.
    #[test]
    fn a_round_trip_errs_by_at_most_half_a_gap() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        for (map, signed) in [(&*SIGNED, true), (&*UNSIGNED, false)] {
            for scale in [1e-8f32, 1e-3, 1.0, 3e4] {
                let values: Vec<f32> = (0..QUANT_BLOCK)
                    .map(|i| {
                        // Magnitudes over several decades, as moments have.
                        let v = next() * 10f32.powi(-((i % 5) as i32)) * scale;
                        if signed {
                            v
                        } else {
                            v * v / scale
                        }
                    })
                    .collect();
                let mut codes = vec![0u8; QUANT_BLOCK];
                let absmax = quantize_block(map, &values, &mut codes);
                let mut back = vec![0.0; QUANT_BLOCK];
                dequantize_block(map, &codes, absmax, &mut back);
                let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert_eq!(absmax, max);
                for (x, y) in values.iter().zip(&back) {
                    let n = x / absmax;
                    let above = map.values.partition_point(|&v| v < n).clamp(1, 255);
                    let gap = map.values[above] - map.values[above - 1];
                    let bound = (0.5 * gap + 1e-6 * n.abs()) * absmax;
                    assert!(
                        (x - y).abs() <= bound,
                        "{x:e} came back {y:e} (bound {bound:e})"
                    );
                }
                // 1 is an entry, -1 is not (the signed map's lowest is -0.993).
                if values.contains(&max) {
                    assert!(back.contains(&max), "the largest value is exact");
                }
            }
        }
        let mut codes = [9u8; 4];
        assert_eq!(quantize_block(&SIGNED, &[0.0; 4], &mut codes), 0.0);
        let mut back = [1.0f32; 4];
        dequantize_block(&SIGNED, &codes, 0.0, &mut back);
        assert_eq!(back, [0.0; 4]);
    }
}
