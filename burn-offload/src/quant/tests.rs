//! The host formats: the published NF4 table and nibble order, hand-derived
//! codes, round-trip bounds, partial and zero blocks, byte counts, names.

use super::*;
use crate::host::optim::quant::{QUANT_BLOCK, SIGNED};

/// Deterministic values in (-1, 1) times magnitudes over a few decades.
pub(super) fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            u * 10f32.powi(-((i / 64 % 4) as i32))
        })
        .collect()
}

/// The codes of `w`, one a value, unpacked by hand (high nibble first).
fn codes(w: &Nf4Weight) -> Vec<u8> {
    let mut out: Vec<u8> = w.packed.iter().flat_map(|b| [b >> 4, b & 0x0f]).collect();
    out.truncate(w.numel());
    out
}

#[test]
fn the_nf4_table_is_bitsandbytes() {
    // bitsandbytes' `get_4bit_type("nf4")`, as published.
    let published: [f64; 16] = [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ];
    for (i, (&ours, &theirs)) in NF4.iter().zip(&published).enumerate() {
        assert_eq!(ours, theirs as f32, "entry {i}");
        // Each published value is an f32 printed exactly.
        assert_eq!(ours as f64, theirs, "entry {i}");
    }
    // The thresholds are the midpoints, to the f32 next to them (the
    // decimal literals round a tie in f32 down).
    for (i, &t) in NF4_THRESHOLDS.iter().enumerate() {
        let mid = (published[i] + published[i + 1]) / 2.0;
        let ulp = f32::EPSILON as f64 * mid.abs();
        assert!((t as f64 - mid).abs() <= ulp, "threshold {i}: {t} vs {mid}");
        assert!(NF4[i] < t && t < NF4[i + 1]);
    }
    // The midpoint of 0.7229568 and 1 is a tie in f32: bitsandbytes' literal
    // rounds below it, where rounding the exact midpoint would go above.
    let tie = (NF4[14] as f64 + 1.0) / 2.0;
    assert!((NF4_THRESHOLDS[14] as f64) < tie && (tie as f32) > NF4_THRESHOLDS[14]);
    assert_eq!(nf4_largest_gap(), NF4[1] - NF4[0]);
}

#[test]
fn pairs_pack_first_in_the_high_nibble() {
    let w = quantize_nf4(&[1.0, -1.0], [1, 2]).unwrap();
    assert_eq!(w.packed, vec![0xF0]);
    let w = quantize_nf4(&[-3.0, 3.0], [2, 1]).unwrap();
    assert_eq!(w.packed, vec![0x0F]);
    // An odd count: the last low nibble is 0.
    let w = quantize_nf4(&[2.0], [1, 1]).unwrap();
    assert_eq!(w.packed, vec![0xF0]);
    assert_eq!(w.dequantize(), vec![2.0]);
}

/// Codes worked out by hand from the midpoints (absmax 1, so the values are
/// the normalised ones): 0.5 lies below mid(0.4407, 0.5626) = 0.50166 →
/// 12; 0.25 between mid(0.1609, 0.2461) = 0.2035 and mid(0.2461, 0.3379) =
/// 0.2920 → 10; -0.25 between mid(-0.3949, -0.2844) = -0.3397 and
/// mid(-0.2844, -0.1848) = -0.2346 → 4; 0.0397 and 0.0 under mid(0,
/// 0.0796) = 0.03979 → 7; 0.04 over it → 8.
#[test]
fn a_hand_made_block_gets_the_hand_derived_codes() {
    let x = [1.0, -1.0, 0.5, 0.0, 0.25, -0.25, 0.0397, 0.04];
    let w = quantize_nf4(&x, [2, 4]).unwrap();
    assert_eq!(codes(&w), vec![15, 0, 12, 7, 10, 4, 7, 8]);
    assert_eq!(w.packed, vec![0xF0, 0xC7, 0xA4, 0x78]);
    // One block: the offset is its absmax, the centred absmax 0 (scale 0).
    assert_eq!(w.offset, 1.0);
    assert_eq!(w.absmax_scales, vec![0.0]);
    assert_eq!(w.absmax(), vec![1.0]);
    let want = [
        1.0,
        -1.0,
        0.440_709_83,
        0.0,
        0.246_112_3,
        -0.284_441_38,
        0.0,
        0.079_580_3,
    ];
    assert_eq!(w.dequantize(), want.to_vec());
    // Exactly at a midpoint: the lower code, as bitsandbytes' `x > t`.
    assert_eq!(nf4_code(NF4_THRESHOLDS[11]), 11);
    assert_eq!(
        nf4_code(f32::from_bits(NF4_THRESHOLDS[11].to_bits() + 1)),
        12
    );
}

/// Half the gap between the dynamic map's entries around `n` (or the
/// distance to its lowest entry below it): the double quantisation's bound.
fn map_bound(n: f32) -> f32 {
    let v = &SIGNED.values;
    if n <= v[0] {
        return v[0] - n;
    }
    let above = v.partition_point(|&e| e < n).clamp(1, 255);
    0.5 * (v[above] - v[above - 1])
}

#[test]
fn an_nf4_round_trip_errs_by_at_most_half_the_largest_gap() {
    // 300 rows of 67: 315 blocks (the last partial), two absmax blocks.
    for (shape, seed) in [([300usize, 67usize], 3u64), ([7, 100], 5), ([1, 64], 9)] {
        let x = values(shape[0] * shape[1], seed);
        let w = quantize_nf4(&x, shape).unwrap();
        let blocks = x.len().div_ceil(NF4_BLOCK);
        assert_eq!(w.blocks(), blocks);
        assert_eq!(w.absmax_scales.len(), blocks.div_ceil(QUANT_BLOCK));
        let true_absmax: Vec<f32> = x
            .chunks(NF4_BLOCK)
            .map(|b| b.iter().fold(0.0f32, |m, v| m.max(v.abs())))
            .collect();
        let mean = true_absmax.iter().map(|&a| a as f64).sum::<f64>() / blocks as f64;
        assert!((w.offset as f64 - mean).abs() <= 1e-7 * mean);
        // The double-quantised absmax: within the dynamic map's resolution.
        let absmax = w.absmax();
        for (b, (&got, &want)) in absmax.iter().zip(&true_absmax).enumerate() {
            let scale = w.absmax_scales[b / QUANT_BLOCK];
            let n = (want - w.offset) / scale;
            let bound = map_bound(n) * scale * (1.0 + 1e-5) + 1e-6 * want;
            assert!((got - want).abs() <= bound, "block {b}: {got} vs {want}");
        }
        // The codes: within half the largest NF4 gap of the value, at the
        // block's true absmax; the whole round trip adds the absmax error.
        let half_gap = 0.5 * nf4_largest_gap();
        let back = w.dequantize();
        for (i, (&c, &v)) in codes(&w).iter().zip(&x).enumerate() {
            let b = i / NF4_BLOCK;
            let a = true_absmax[b];
            let coded = NF4[c as usize] * a;
            assert!(
                (coded - v).abs() <= half_gap * a * (1.0 + 1e-6),
                "{i}: {v} → {coded}"
            );
            // It is the nearest code.
            let nearest = NF4
                .iter()
                .map(|&e| (e * a - v).abs())
                .fold(f32::MAX, f32::min);
            assert!((coded - v).abs() <= nearest * (1.0 + 1e-6) + 1e-12, "{i}");
            let bound = half_gap * a + (absmax[b] - a).abs() + 1e-6 * a;
            assert!(
                (back[i] - v).abs() <= bound,
                "{i}: {v} came back {}",
                back[i]
            );
        }
        assert_eq!(w.bytes(), BaseDtype::Nf4.host_bytes(shape));
    }
}

#[test]
fn zero_blocks_come_back_zero() {
    // A block of zeros between two others, a short zero block at the end.
    let mut x = values(64 * 3 + 10, 11);
    x[64..128].fill(0.0);
    x[192..].fill(0.0);
    let w = quantize_nf4(&x, [1, x.len()]).unwrap();
    assert!(w.packed[32..64].iter().all(|&b| b == 0x77));
    assert!(w.packed[96..].iter().all(|&b| b == 0x77));
    let back = w.dequantize();
    assert!(back.iter().all(|v| v.is_finite()));
    assert!(back[64..128].iter().all(|&v| v == 0.0));
    assert!(back[192..].iter().all(|&v| v == 0.0));
    // All zeros: offset 0, scale 0, every value 0.
    let w = quantize_nf4(&[0.0; 130], [10, 13]).unwrap();
    assert_eq!((w.offset, w.absmax_scales.clone()), (0.0, vec![0.0]));
    assert_eq!(w.dequantize(), vec![0.0; 130]);
    let w = quantize_int8(&[0.0; 6], [2, 3]).unwrap();
    assert_eq!(
        (w.codes.clone(), w.scales.clone()),
        (vec![0; 6], vec![0.0; 2])
    );
    assert_eq!(w.dequantize(), vec![0.0; 6]);
}

#[test]
fn an_int8_round_trip_errs_by_at_most_s_over_254() {
    let shape = [37, 50];
    let mut x = values(shape[0] * shape[1], 21);
    x[100..150].fill(0.0);
    let w = quantize_int8(&x, shape).unwrap();
    assert_eq!(w.scales[2], 0.0);
    let back = w.dequantize();
    for (r, (row, got)) in x.chunks(50).zip(back.chunks(50)).enumerate() {
        let s = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(w.scales[r], s);
        for (&v, &y) in row.iter().zip(got) {
            assert!(
                (v - y).abs() <= s / 254.0 * (1.0 + 1e-5),
                "row {r}: {v} → {y}"
            );
        }
        // The row's largest magnitude is ±127.
        let codes = &w.codes[r * 50..(r + 1) * 50];
        if s > 0.0 {
            assert_eq!(codes.iter().map(|c| c.unsigned_abs()).max(), Some(127));
        }
    }
    // By hand: a row [1, -0.5, 0.25, 0.002] has s = 1: 127, -63.5 → -64
    // (half away from zero), 31.75 → 32, 0.254 → 0.
    let w = quantize_int8(&[1.0, -0.5, 0.25, 0.002], [1, 4]).unwrap();
    assert_eq!(w.codes, vec![127, -64, 32, 0]);
    assert_eq!(w.bytes(), BaseDtype::Int8.host_bytes([1, 4]));
}

#[test]
fn a_4096_square_weight_takes_the_expected_host_bytes() {
    let shape = [4096, 4096];
    assert_eq!(BaseDtype::Bf16.host_bytes(shape), 33_554_432);
    // 16 Mi codes and 4096 f32 scales.
    assert_eq!(BaseDtype::Int8.host_bytes(shape), 16_777_216 + 16_384);
    // 8 Mi packed bytes, 262144 absmax codes, 1024 f32 scales, the offset.
    assert_eq!(
        BaseDtype::Nf4.host_bytes(shape),
        8_388_608 + 262_144 + 4096 + 4
    );
    assert_eq!(BaseDtype::Bf16.bytes_per_param(shape), 2.0);
    assert_eq!(BaseDtype::Int8.bytes_per_param(shape), 1.0 + 4.0 / 4096.0);
    let nf4 = 0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0) + 4.0 / 16_777_216.0;
    assert!((BaseDtype::Nf4.bytes_per_param(shape) - nf4).abs() < 1e-12);
    assert_eq!(BaseDtype::Nf4.bytes_per_param([0, 5]), 0.0);
}

#[test]
fn formats_parse_from_their_names() {
    for d in BaseDtype::ALL {
        assert_eq!(d.name().parse::<BaseDtype>(), Ok(d));
        assert_eq!(d.to_string().to_uppercase().parse::<BaseDtype>(), Ok(d));
    }
    assert_eq!(
        "fp4".parse::<BaseDtype>(),
        Err(QuantError::UnknownDtype("fp4".into()))
    );
    assert!(matches!(
        quantize_nf4(&[0.0; 3], [2, 2]),
        Err(QuantError::Length { len: 3, .. })
    ));
    assert!(quantize_int8(&[0.0; 5], [2, 2]).is_err());
}
