//! The optimizers against textbook recurrences and their own invariants.

use burn::tensor::bf16;

use super::slices::CHUNK;
use super::*;

#[test]
fn invalid_values_are_rejected() {
    let bad = |c: AdamWConfig| {
        OptimizerConfig::AdamW(c)
            .validate()
            .unwrap_err()
            .to_string()
    };
    let base = AdamWConfig::default();
    assert!(bad(AdamWConfig {
        beta_1: 1.0,
        ..base
    })
    .contains("beta_1 must be in [0, 1)"));
    assert!(bad(AdamWConfig {
        beta_2: f32::NAN,
        ..base
    })
    .contains("beta_2"));
    assert!(bad(AdamWConfig {
        epsilon: 0.0,
        ..base
    })
    .contains("epsilon must be positive"));
    assert!(bad(AdamWConfig {
        weight_decay: -0.1,
        ..base
    })
    .contains("weight_decay"));
    let sgd = OptimizerConfig::Sgd(SgdConfig {
        momentum: -0.5,
        weight_decay: 0.0,
    });
    assert!(sgd.validate().unwrap_err().to_string().contains("momentum"));
    assert!(check_lr(f64::INFINITY).is_err() && check_lr(-1.0).is_err() && check_lr(0.0).is_ok());
    assert!(OptimizerConfig::AdamW(base).validate().is_ok());
}

#[test]
fn sgd_with_momentum_matches_the_textbook_recurrence() {
    let config = OptimizerConfig::Sgd(SgdConfig {
        momentum: 0.9,
        weight_decay: 0.01,
    });
    let (mut p, mut m, mut v) = (vec![1.0f32, -2.0], vec![0.0; 2], vec![0.0; 2]);
    let (mut want_p, mut want_buf) = (p.clone(), vec![0.0f32; 2]);
    for step in 1..=3u64 {
        let g = [0.5f32 * step as f32, -0.25];
        config.update(
            step,
            0.1,
            1.0,
            UpdateSlices {
                params: &mut p,
                moments: MomentSlices::F32 {
                    m: &mut m,
                    v: &mut v,
                },
                grads: GradSlice::F32(&g),
                bf16: None,
            },
        );
        for i in 0..2 {
            let d = g[i] + 0.01 * want_p[i];
            want_buf[i] = if step == 1 { d } else { 0.9 * want_buf[i] + d };
            want_p[i] -= 0.1 * want_buf[i];
        }
    }
    assert_eq!(p, want_p);
}

/// Updating a table's picked rows, then the others, gives the bits of one
/// update of the whole table, bf16 copy included, for both optimizers.
#[test]
fn rows_updated_in_two_selections_equal_one_update() {
    let (rows, width) = (7, 5);
    let n = rows * width;
    let grads: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let start: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
    let picked = [true, false, false, true, true, false, true];
    let sgd = OptimizerConfig::Sgd(SgdConfig {
        momentum: 0.9,
        weight_decay: 0.01,
    });
    for config in [OptimizerConfig::AdamW(AdamWConfig::default()), sgd] {
        let run = |selections: &[Rows<'_>]| {
            let (mut p, mut m, mut v) = (start.clone(), vec![0.1; n], vec![0.2; n]);
            let mut copy = vec![bf16::ZERO; n];
            for step in 1..=2 {
                for &rows in selections {
                    let slices = UpdateSlices {
                        params: &mut p,
                        moments: MomentSlices::F32 {
                            m: &mut m,
                            v: &mut v,
                        },
                        grads: GradSlice::F32(&grads),
                        bf16: Some(&mut copy),
                    };
                    config.update_rows(step, 1e-2, 0.5, slices, rows);
                }
            }
            (p, m, v, copy)
        };
        let pick = |pick| Rows::Picked {
            width,
            picked: &picked,
            pick,
        };
        let whole = run(&[Rows::All]);
        assert_eq!(run(&[pick(true), pick(false)]), whole);
        // One selection alone leaves the other rows as they were.
        let (p, ..) = run(&[pick(true)]);
        for (r, &was_picked) in picked.iter().enumerate() {
            let row = r * width..(r + 1) * width;
            let want = if was_picked {
                &whole.0[row.clone()]
            } else {
                &start[row.clone()]
            };
            assert_eq!(&p[row], want, "row {r}");
        }
    }
}

/// The bf16 copy written during the update is the rounding of the new
/// parameters, across chunk boundaries, and the f32 result is unchanged.
#[test]
fn the_bf16_copy_is_the_rounded_update() {
    let n = 3 * CHUNK + 17;
    let grads: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let start: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
    let config = OptimizerConfig::AdamW(AdamWConfig::default());
    let run = |copy: Option<&mut [bf16]>| {
        let (mut p, mut m, mut v) = (start.clone(), vec![0.0; n], vec![0.0; n]);
        let slices = UpdateSlices {
            params: &mut p,
            moments: MomentSlices::F32 {
                m: &mut m,
                v: &mut v,
            },
            grads: GradSlice::F32(&grads),
            bf16: copy,
        };
        config.update(1, 1e-2, 1.0, slices);
        p
    };
    let mut copy = vec![bf16::ZERO; n];
    let with = run(Some(&mut copy));
    assert_eq!(with, run(None));
    assert!(copy
        .iter()
        .zip(&with)
        .all(|(c, p)| *c == bf16::from_f32(*p)));
}

/// A gradient held in bf16 updates exactly as the same values widened to
/// f32, for both optimizers, whole and by picked rows.
#[test]
fn bf16_gradients_update_as_their_f32_values() {
    let n = 3 * CHUNK + 77;
    let g16: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f32((i as f32 * 0.37).sin() * 1e-2))
        .collect();
    let g32: Vec<f32> = g16.iter().map(|v| v.to_f32()).collect();
    let start: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
    let width = 7;
    let picked: Vec<bool> = (0..n / width).map(|r| r % 3 == 0).collect();
    for optimizer in [
        OptimizerConfig::AdamW(AdamWConfig::default()),
        OptimizerConfig::Sgd(SgdConfig {
            momentum: 0.9,
            weight_decay: 1e-3,
        }),
    ] {
        let run = |grads: GradSlice<'_>, rows: Rows<'_>| {
            let len = match rows {
                Rows::All => n,
                Rows::Picked { width, picked, .. } => width * picked.len(),
            };
            let (mut p, mut m, mut v) = (start[..len].to_vec(), vec![0.1; len], vec![0.2; len]);
            for step in 1..=3 {
                let grads = grads.split_at(len).0;
                let slices = UpdateSlices {
                    params: &mut p,
                    moments: MomentSlices::F32 {
                        m: &mut m,
                        v: &mut v,
                    },
                    grads,
                    bf16: None,
                };
                optimizer.update_rows(step, 1e-2, 0.5, slices, rows);
            }
            (p, m, v)
        };
        let rows = Rows::Picked {
            width,
            picked: &picked,
            pick: true,
        };
        for rows in [Rows::All, rows] {
            assert!(
                run(GradSlice::Bf16(&g16), rows) == run(GradSlice::F32(&g32), rows),
                "{optimizer:?}: bf16 and f32 gradients updated differently"
            );
        }
    }
}

/// 8-bit moments: from zero state the first update's parameters equal the
/// f32 update's bit for bit (the moments it reads are exact zeros), and the
/// moments it keeps are the f32 ones quantised; updating a table's rows in
/// two selections of whole blocks gives the bits of one update.
#[test]
fn eight_bit_moments_quantise_the_f32_update() {
    use super::quant::{dequantize_block, QUANT_BLOCK, SIGNED, UNSIGNED};
    let n = 2 * CHUNK + 5 * QUANT_BLOCK;
    let grads: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 1e-2).collect();
    let start: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
    let optimizer = OptimizerConfig::AdamW(AdamWConfig::default());
    let q8 = |p: &mut Vec<f32>, m: &mut Q8Pair, rows: Rows<'_>, step: u64| {
        let slices = UpdateSlices {
            params: p,
            moments: MomentSlices::Q8 {
                m: &mut m.0,
                m_absmax: &mut m.1,
                v: &mut m.2,
                v_absmax: &mut m.3,
            },
            grads: GradSlice::F32(&grads),
            bf16: None,
        };
        optimizer.update_rows(step, 1e-2, 1.0, slices, rows);
    };
    let blocks = n.div_ceil(QUANT_BLOCK);
    let zero = || -> Q8Pair { (vec![0; n], vec![0.0; blocks], vec![0; n], vec![0.0; blocks]) };

    let (mut p8, mut s8) = (start.clone(), zero());
    q8(&mut p8, &mut s8, Rows::All, 1);
    let (mut p32, mut m32, mut v32) = (start.clone(), vec![0.0; n], vec![0.0; n]);
    optimizer.update(
        1,
        1e-2,
        1.0,
        UpdateSlices {
            params: &mut p32,
            moments: MomentSlices::F32 {
                m: &mut m32,
                v: &mut v32,
            },
            grads: GradSlice::F32(&grads),
            bf16: None,
        },
    );
    assert!(p8 == p32, "first update's parameters");
    let dequantized = |codes: &[u8], absmax: &[f32], signed: bool| {
        let map = if signed { &*SIGNED } else { &*UNSIGNED };
        let mut out = vec![0.0; n];
        for ((c, o), &a) in codes
            .chunks(QUANT_BLOCK)
            .zip(out.chunks_mut(QUANT_BLOCK))
            .zip(absmax)
        {
            dequantize_block(map, c, a, o);
        }
        out
    };
    for (got, want, scales) in [
        (dequantized(&s8.0, &s8.1, true), &m32, &s8.1),
        (dequantized(&s8.2, &s8.3, false), &v32, &s8.3),
    ] {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            // The widest gap of either map is 0.9/64 of the block's scale.
            let bound = 0.5 * (0.9 / 64.0) * scales[i / QUANT_BLOCK] * 1.0001;
            assert!((g - w).abs() <= bound, "moment {i}: {g} vs {w}");
        }
    }

    // Rows of 512 (two blocks): the picked rows, then the others.
    let width = 2 * QUANT_BLOCK;
    let picked: Vec<bool> = (0..n / width).map(|r| r % 3 == 1).collect();
    let len = width * picked.len();
    let (mut whole_p, mut whole_s) = (p8.clone(), s8.clone());
    let (mut two_p, mut two_s) = (p8.clone(), s8.clone());
    q8(&mut whole_p, &mut whole_s, Rows::All, 2);
    for pick in [true, false] {
        let rows = Rows::Picked {
            width,
            picked: &picked,
            pick,
        };
        let mut p = two_p[..len].to_vec();
        let mut s: Q8Pair = (
            two_s.0[..len].to_vec(),
            two_s.1[..len / QUANT_BLOCK].to_vec(),
            two_s.2[..len].to_vec(),
            two_s.3[..len / QUANT_BLOCK].to_vec(),
        );
        let slices = UpdateSlices {
            params: &mut p,
            moments: MomentSlices::Q8 {
                m: &mut s.0,
                m_absmax: &mut s.1,
                v: &mut s.2,
                v_absmax: &mut s.3,
            },
            grads: GradSlice::F32(&grads[..len]),
            bf16: None,
        };
        optimizer.update_rows(2, 1e-2, 1.0, slices, rows);
        two_p[..len].copy_from_slice(&p);
        two_s.0[..len].copy_from_slice(&s.0);
        two_s.1[..len / QUANT_BLOCK].copy_from_slice(&s.1);
        two_s.2[..len].copy_from_slice(&s.2);
        two_s.3[..len / QUANT_BLOCK].copy_from_slice(&s.3);
    }
    assert!(
        whole_p[..len] == two_p[..len] && whole_s.0[..len] == two_s.0[..len],
        "two selections of rows differ from one update"
    );
    assert!(whole_s.1[..len / QUANT_BLOCK] == two_s.1[..len / QUANT_BLOCK]);
}

type Q8Pair = (Vec<u8>, Vec<f32>, Vec<u8>, Vec<f32>);
