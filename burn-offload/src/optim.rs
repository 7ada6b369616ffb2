//! Optimizers over host slabs: AdamW (numerically burn-optim's) and SGD with
//! momentum, as fused loops over `&mut [f32]` split across threads by rayon.
//!
//! Each element's update reads and writes its parameter, moments and gradient
//! once, with no branches in the loop, so the compiler vectorises it; one
//! step over a slab is one pass over memory instead of the ~10 passes of
//! tensor-op optimizers.

use burn::tensor::bf16;
use rayon::prelude::*;

/// Elements per rayon task: large enough to amortise scheduling, small enough
/// to balance a block across cores.
const CHUNK: usize = 1 << 15;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    /// Decoupled weight decay (multiplied by the learning rate).
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    /// burn-optim's defaults.
    fn default() -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-5,
            weight_decay: 1e-4,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    pub momentum: f32,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerConfig {
    AdamW(AdamWConfig),
    Sgd(SgdConfig),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptimizerError {
    #[error("invalid optimizer config: {0}")]
    Invalid(String),
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), OptimizerError> {
    if ok {
        Ok(())
    } else {
        Err(OptimizerError::Invalid(what()))
    }
}

impl OptimizerConfig {
    pub fn validate(&self) -> Result<(), OptimizerError> {
        let unit = |x: f32| x.is_finite() && (0.0..1.0).contains(&x);
        let non_negative = |x: f32| x.is_finite() && x >= 0.0;
        match *self {
            OptimizerConfig::AdamW(c) => {
                check(unit(c.beta_1), || {
                    format!("beta_1 must be in [0, 1), got {}", c.beta_1)
                })?;
                check(unit(c.beta_2), || {
                    format!("beta_2 must be in [0, 1), got {}", c.beta_2)
                })?;
                check(c.epsilon.is_finite() && c.epsilon > 0.0, || {
                    format!("epsilon must be positive, got {}", c.epsilon)
                })?;
                check(non_negative(c.weight_decay), || {
                    format!("weight_decay must be >= 0, got {}", c.weight_decay)
                })
            }
            OptimizerConfig::Sgd(c) => {
                check(unit(c.momentum), || {
                    format!("momentum must be in [0, 1), got {}", c.momentum)
                })?;
                check(non_negative(c.weight_decay), || {
                    format!("weight_decay must be >= 0, got {}", c.weight_decay)
                })
            }
        }
    }
}

/// Checks a learning rate before it touches any state.
pub fn check_lr(lr: f64) -> Result<(), OptimizerError> {
    check(lr.is_finite() && lr >= 0.0, || {
        format!("learning rate must be a finite number >= 0, got {lr}")
    })
}

/// The state a group's update works on: parameters, two moment buffers
/// (SGD uses the first as its momentum buffer) and the gradient; and, in bf16
/// compute mode, the bf16 copy of the parameters to write as they change.
pub struct UpdateSlices<'a> {
    pub params: &'a mut [f32],
    pub m: &'a mut [f32],
    pub v: &'a mut [f32],
    pub grads: &'a [f32],
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
        width: usize,
        picked: &'a [bool],
        pick: bool,
    },
}

/// Runs `update` on matching pieces of the slices in parallel: chunks of
/// [`CHUNK`], or the selected rows. With a bf16 copy, each piece's new
/// parameters are rounded into it while they are still in cache (no second
/// pass over the slab). The update is elementwise, so how the slices are cut
/// changes no result. Each piece first waits while one of the forward's
/// weight copies is in flight (`copy_window`).
fn par_update<F>(s: UpdateSlices<'_>, rows: Rows<'_>, update: F)
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
                        crate::copy_window::wait_for_copies();
                        update(p, m, v, g);
                        crate::precision::round_into(o, p);
                    }
                })
        }
        None => pieces.for_each(|(r, (((p, m), v), g))| {
            if selected(r) {
                crate::copy_window::wait_for_copies();
                update(p, m, v, g);
            }
        }),
    }
}

impl OptimizerConfig {
    /// Applies update number `step` (1-based: Adam's bias correction) with
    /// learning rate `lr` to one group; gradients are multiplied by
    /// `grad_scale` first (global-norm clipping, accumulation averaging).
    pub fn update(&self, step: u64, lr: f64, grad_scale: f32, s: UpdateSlices<'_>) {
        self.update_rows(step, lr, grad_scale, s, Rows::All);
    }

    /// [`OptimizerConfig::update`] of the elements `rows` selects only. An
    /// element's update does not depend on the others', so updating a table's
    /// rows in two selections gives the bits one update gives.
    pub fn update_rows(
        &self,
        step: u64,
        lr: f64,
        grad_scale: f32,
        s: UpdateSlices<'_>,
        rows: Rows<'_>,
    ) {
        let n = s.params.len();
        assert!(
            s.m.len() == n
                && s.v.len() == n
                && s.grads.len() == n
                && s.bf16.as_ref().is_none_or(|b| b.len() == n),
            "slab lengths differ"
        );
        match *self {
            OptimizerConfig::AdamW(c) => adamw(&c, step, lr, grad_scale, s, rows),
            OptimizerConfig::Sgd(c) => sgd(&c, step, lr, grad_scale, s, rows),
        }
    }
}

fn adamw(
    c: &AdamWConfig,
    step: u64,
    lr: f64,
    grad_scale: f32,
    s: UpdateSlices<'_>,
    rows: Rows<'_>,
) {
    // Scalars exactly as burn-optim computes them (f32 bias corrections, f64
    // decay factor rounded to f32), so results agree to rounding.
    let time = step.min(i32::MAX as u64) as i32;
    let (b1, b2, eps) = (c.beta_1, c.beta_2, c.epsilon);
    let (f1, f2) = (1.0 - b1, 1.0 - b2);
    let bias_1 = 1.0 - b1.powi(time);
    let bias_2 = 1.0 - b2.powi(time);
    let decay = (1.0 - lr * c.weight_decay as f64) as f32;
    let lr = lr as f32;
    par_update(s, rows, |p, m, v, g| {
        for i in 0..p.len() {
            let g = g[i] * grad_scale;
            let mi = m[i] * b1 + g * f1;
            let vi = v[i] * b2 + g * g * f2;
            m[i] = mi;
            v[i] = vi;
            let delta = (mi / bias_1) / ((vi / bias_2).sqrt() + eps);
            p[i] = p[i] * decay - delta * lr;
        }
    });
}

fn sgd(c: &SgdConfig, step: u64, lr: f64, grad_scale: f32, s: UpdateSlices<'_>, rows: Rows<'_>) {
    let (mu, wd, lr) = (c.momentum, c.weight_decay, lr as f32);
    // The first step starts the momentum buffer at the gradient itself.
    let keep = if step <= 1 { 0.0 } else { mu };
    // SGD keeps one buffer; the second moment slab goes unused.
    par_update(s, rows, |p, buf, _, g| {
        for i in 0..p.len() {
            let g = g[i] * grad_scale + wd * p[i];
            let b = keep * buf[i] + g;
            buf[i] = b;
            p[i] -= lr * b;
        }
    });
}

/// Sum of squares of a slice, in f64 (parallel; the global gradient norm is
/// the square root of the sum over all groups).
pub fn sum_of_squares(x: &[f32]) -> f64 {
    x.par_chunks(CHUNK)
        .map(|c| c.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>())
        .sum()
}

#[cfg(test)]
mod tests {
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
        assert!(
            check_lr(f64::INFINITY).is_err() && check_lr(-1.0).is_err() && check_lr(0.0).is_ok()
        );
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
                    m: &mut m,
                    v: &mut v,
                    grads: &g,
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
                            m: &mut m,
                            v: &mut v,
                            grads: &grads,
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
                m: &mut m,
                v: &mut v,
                grads: &grads,
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
}
