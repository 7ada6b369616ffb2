//! The optimizers' settings, their checks, and the update's dispatch.

use super::adamw::{self, AdamWConfig};
use super::sgd::{self, SgdConfig};
use super::slices::{Rows, UpdateSlices};

/// The optimizer the engine runs over the host slabs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerConfig {
    /// AdamW with decoupled weight decay.
    AdamW(AdamWConfig),
    /// SGD with momentum and an L2 penalty.
    Sgd(SgdConfig),
}

/// A setting of the optimizer, or a learning rate, out of its range.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptimizerError {
    /// An optimizer setting outside the range it must be in.
    #[error("invalid optimizer config: {name} must be {range}, got {value}")]
    OutOfRange {
        /// The setting (`beta_1`, `momentum`, ...).
        name: &'static str,
        /// The range it must lie in, in words.
        range: &'static str,
        /// The value given.
        value: f64,
    },
    /// A learning rate that is not a finite number >= 0.
    #[error("learning rate must be a finite number >= 0, got {0}")]
    LearningRate(f64),
}

fn check(
    ok: bool,
    name: &'static str,
    range: &'static str,
    value: f32,
) -> Result<(), OptimizerError> {
    if ok {
        Ok(())
    } else {
        Err(OptimizerError::OutOfRange {
            name,
            range,
            value: value as f64,
        })
    }
}

impl OptimizerConfig {
    /// Checks every setting's range.
    pub fn validate(&self) -> Result<(), OptimizerError> {
        let unit = |x: f32| x.is_finite() && (0.0..1.0).contains(&x);
        let non_negative = |x: f32| x.is_finite() && x >= 0.0;
        match *self {
            OptimizerConfig::AdamW(c) => {
                check(unit(c.beta_1), "beta_1", "in [0, 1)", c.beta_1)?;
                check(unit(c.beta_2), "beta_2", "in [0, 1)", c.beta_2)?;
                check(
                    c.epsilon.is_finite() && c.epsilon > 0.0,
                    "epsilon",
                    "positive",
                    c.epsilon,
                )?;
                check(
                    non_negative(c.weight_decay),
                    "weight_decay",
                    ">= 0",
                    c.weight_decay,
                )
            }
            OptimizerConfig::Sgd(c) => {
                check(unit(c.momentum), "momentum", "in [0, 1)", c.momentum)?;
                check(
                    non_negative(c.weight_decay),
                    "weight_decay",
                    ">= 0",
                    c.weight_decay,
                )
            }
        }
    }
}

/// Checks a learning rate before it touches any state.
pub fn check_lr(lr: f64) -> Result<(), OptimizerError> {
    if lr.is_finite() && lr >= 0.0 {
        Ok(())
    } else {
        Err(OptimizerError::LearningRate(lr))
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
            s.moments.len() == n
                && s.grads.len() == n
                && s.bf16.as_ref().is_none_or(|b| b.len() == n),
            "slab lengths differ"
        );
        match *self {
            OptimizerConfig::AdamW(c) => adamw::update(&c, step, lr, grad_scale, s, rows),
            OptimizerConfig::Sgd(c) => sgd::update(&c, step, lr, grad_scale, s, rows),
        }
    }
}
