//! The next token from a position's logits: greedy, or drawn from a seeded
//! generator after the repetition penalty, the temperature, top-k and
//! top-p, in the order transformers' `generate` applies them.

use rand::{rngs::StdRng, Rng, SeedableRng};

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Divides the logits before drawing; 0 takes the most likely token
    /// (greedy).
    pub temperature: f64,
    /// Draws among the `top_k` most likely tokens only (0: all).
    pub top_k: usize,
    /// Draws among the most likely tokens whose probabilities sum to at
    /// least `top_p` (1: all).
    pub top_p: f64,
    /// Divides a positive logit of a token already in the context by this,
    /// and multiplies a negative one (1: none), as transformers does.
    pub repetition_penalty: f64,
    /// The generator's seed: the same seed draws the same tokens.
    pub seed: u64,
}

impl Default for Sampling {
    /// Greedy.
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

/// Why sampling settings were refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("--temperature must be a number >= 0 (0 is greedy), got {0}")]
    Temperature(f64),
    #[error("--top-p must be in (0, 1], got {0}")]
    TopP(f64),
    #[error("--repetition-penalty must be a positive number (1 is none), got {0}")]
    RepetitionPenalty(f64),
}

impl Sampling {
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(SamplingError::RepetitionPenalty(self.repetition_penalty));
        }
        Ok(())
    }

    /// Whether the choice is the logits' argmax whatever the context: the
    /// device can then pick it and only the id crosses to the host.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 && self.repetition_penalty == 1.0
    }
}

/// [`Sampling`] with its generator.
pub struct Sampler {
    sampling: Sampling,
    rng: StdRng,
}

impl Sampler {
    pub fn new(sampling: Sampling) -> Self {
        Self {
            sampling,
            rng: StdRng::seed_from_u64(sampling.seed),
        }
    }

    pub fn sampling(&self) -> &Sampling {
        &self.sampling
    }

    /// The next token after `context` from its `logits` (changed in place by
    /// the penalty and the temperature).
    pub fn pick(&mut self, logits: &mut [f32], context: &[u32]) -> u32 {
        let s = self.sampling;
        if s.repetition_penalty != 1.0 {
            let penalty = s.repetition_penalty as f32;
            let mut seen = vec![false; logits.len()];
            for &id in context {
                if let Some(logit) = logits.get_mut(id as usize).filter(|_| !seen[id as usize]) {
                    seen[id as usize] = true;
                    *logit = if *logit > 0.0 {
                        *logit / penalty
                    } else {
                        *logit * penalty
                    };
                }
            }
        }
        if s.temperature == 0.0 {
            return argmax(logits);
        }
        // Candidates, most likely first: the top-k, or every token.
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
        if s.top_k > 0 && s.top_k < order.len() {
            order.select_nth_unstable_by(s.top_k - 1, by_logit);
            order.truncate(s.top_k);
        }
        order.sort_unstable_by(|a, b| by_logit(a, b).then(a.cmp(b)));
        let max = logits[order[0] as usize] as f64;
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i as usize] as f64 - max) / s.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        // The shortest head of the candidates whose mass reaches top_p.
        let mut kept = weights.len();
        if s.top_p < 1.0 {
            let mut mass = 0.0;
            for (i, w) in weights.iter().enumerate() {
                mass += w / total;
                if mass >= s.top_p {
                    kept = i + 1;
                    break;
                }
            }
        }
        let total: f64 = weights[..kept].iter().sum();
        let mut draw = self.rng.random::<f64>() * total;
        for (&id, w) in order.iter().zip(&weights[..kept]) {
            draw -= w;
            if draw <= 0.0 {
                return id;
            }
        }
        order[kept - 1]
    }
}

/// The index of the largest logit (the first of equals).
pub fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &l)| {
            if l > best.1 {
                (i, l)
            } else {
                best
            }
        })
        .0 as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(edit: impl FnOnce(&mut Sampling)) -> Sampler {
        let mut sampling = Sampling {
            temperature: 1.0,
            seed: 7,
            ..Sampling::default()
        };
        edit(&mut sampling);
        sampling.validate().unwrap();
        Sampler::new(sampling)
    }

    /// Counts of each token over `n` draws.
    fn counts(sampler: &mut Sampler, logits: &[f32], context: &[u32], n: usize) -> Vec<usize> {
        let mut counts = vec![0; logits.len()];
        for _ in 0..n {
            counts[sampler.pick(&mut logits.to_vec(), context) as usize] += 1;
        }
        counts
    }

    const LOGITS: [f32; 5] = [2.0, 1.0, 0.5, -1.0, 1.9];

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = sampler(|s| s.temperature = 0.0);
        assert!(s.sampling().is_greedy());
        assert_eq!(s.pick(&mut LOGITS.to_vec(), &[]), 0);
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens_and_another_seed_others() {
        let draws = |seed| {
            let mut s = sampler(|s| s.seed = seed);
            (0..64)
                .map(|_| s.pick(&mut LOGITS.to_vec(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
    }

    #[test]
    fn top_k_and_top_p_keep_only_the_head() {
        let counts_k = counts(&mut sampler(|s| s.top_k = 2), &LOGITS, &[], 2000);
        assert_eq!((counts_k[1], counts_k[2], counts_k[3]), (0, 0, 0));
        assert!(counts_k[0] > 0 && counts_k[4] > 0);
        // Probabilities ≈ 0.36, 0.33, 0.13, 0.08, 0.03 (ids 0, 4, 1, 2, 3):
        // 0.6 needs the first two.
        let counts_p = counts(&mut sampler(|s| s.top_p = 0.6), &LOGITS, &[], 2000);
        assert_eq!((counts_p[1], counts_p[2], counts_p[3]), (0, 0, 0));
        assert!(counts_p[0] > 0 && counts_p[4] > 0);
        // Both: top-k first, then top-p over what is left.
        let mut s = sampler(|s| {
            s.top_k = 3;
            s.top_p = 0.01
        });
        assert_eq!(counts(&mut s, &LOGITS, &[], 100)[0], 100);
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let cold = counts(&mut sampler(|s| s.temperature = 0.05), &LOGITS, &[], 1000);
        assert!(cold[0] > 850, "{cold:?}");
        let hot = counts(&mut sampler(|s| s.temperature = 100.0), &LOGITS, &[], 5000);
        assert!(hot.iter().all(|&c| c > 700), "{hot:?}");
    }

    #[test]
    fn repetition_penalty_lowers_the_tokens_seen() {
        // Greedy, but the penalty is applied: 2.0 / 1.5 < 1.9.
        let mut s = sampler(|s| {
            s.temperature = 0.0;
            s.repetition_penalty = 1.5
        });
        assert!(!s.sampling().is_greedy());
        assert_eq!(s.pick(&mut LOGITS.to_vec(), &[0, 0]), 4);
        // A negative logit is multiplied: -1 → -1.5.
        let mut logits = LOGITS.to_vec();
        s.pick(&mut logits, &[3, 0]);
        assert_eq!(logits[3], -1.5);
        assert_eq!(logits[0], 2.0 / 1.5);
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad = |edit: fn(&mut Sampling)| {
            let mut s = Sampling::default();
            edit(&mut s);
            s.validate().unwrap_err()
        };
        assert_eq!(
            bad(|s| s.temperature = -1.0),
            SamplingError::Temperature(-1.0)
        );
        assert_eq!(bad(|s| s.top_p = 0.0), SamplingError::TopP(0.0));
        assert_eq!(
            bad(|s| s.repetition_penalty = 0.0),
            SamplingError::RepetitionPenalty(0.0)
        );
    }
}
