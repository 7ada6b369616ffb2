//! SGD with momentum: its settings and per-element math.

use super::slices::{par_update, Rows, UpdateSlices};

/// SGD's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// Momentum (0: plain SGD).
    pub momentum: f32,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
}

/// SGD with momentum over `s` (the rows `rows` selects).
pub(super) fn update(
    c: &SgdConfig,
    step: u64,
    lr: f64,
    grad_scale: f32,
    s: UpdateSlices<'_>,
    rows: Rows<'_>,
) {
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
