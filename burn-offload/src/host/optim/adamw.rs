//! AdamW: its settings and per-element math.

use super::slices::{par_update, Rows, UpdateSlices};

/// AdamW's settings (burn-optim's meaning and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Decay of the first moment.
    pub beta_1: f32,
    /// Decay of the second moment.
    pub beta_2: f32,
    /// Added to the second moment's root in the denominator.
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

/// AdamW over `s` (the rows `rows` selects), numerically burn-optim's.
pub(super) fn update(
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
