//! Learning-rate schedule: linear warm-up, then cosine decay to a floor.

/// `lr(step)` for `step` in `0..total`: rises linearly from `peak/warmup` to
/// `peak` over `warmup` steps, then follows a half cosine from `peak` down to
/// `peak · min_ratio` at the last step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupCosine {
    pub peak: f64,
    pub warmup: usize,
    pub total: usize,
    pub min_ratio: f64,
}

impl WarmupCosine {
    pub fn lr(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.peak * (step + 1) as f64 / self.warmup as f64;
        }
        let decay_steps = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / decay_steps as f64).min(1.0);
        let floor = self.peak * self.min_ratio;
        floor + 0.5 * (self.peak - floor) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_then_decays_to_the_floor() {
        let s = WarmupCosine {
            peak: 1.0,
            warmup: 10,
            total: 110,
            min_ratio: 0.1,
        };
        assert!((s.lr(0) - 0.1).abs() < 1e-12);
        assert!((s.lr(9) - 1.0).abs() < 1e-12);
        assert!((s.lr(10) - 1.0).abs() < 1e-12);
        assert!((s.lr(60) - 0.55).abs() < 1e-12);
        assert!((s.lr(110) - 0.1).abs() < 1e-12);
        assert!((10..110).all(|i| s.lr(i + 1) <= s.lr(i)));
    }
}
