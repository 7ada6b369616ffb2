//! Evaluation during a run: when it is due, the loss over the held-out
//! windows (each process its share, summed across them), its lines, and the
//! best so far that `--keep-best` keeps.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn_offload::checkpoint;

use super::job::{Job, JobError};
use super::state::{BestEval, Evaluation};
use crate::data::{trained_targets, EvalBatch};
use crate::metrics::EvalMetrics;
use crate::processes::RankError;
use crate::progress::Progress;

impl Job<'_> {
    /// Whether the run evaluates once `done` steps are done: every
    /// `--eval-every` steps and at the end of the schedule.
    pub(super) fn eval_due(&self, done: usize) -> bool {
        let every = self.opts.eval_every;
        self.eval.is_some()
            && ((every > 0 && done.is_multiple_of(every)) || done == self.opts.steps)
    }

    /// The mean loss over the held-out windows' trained tokens, `nll`
    /// giving a batch's summed loss; with several processes each takes
    /// every world-th window and the sums are added across them.
    pub(super) fn evaluate(
        &self,
        mut nll: impl FnMut(&EvalBatch) -> Result<f64, JobError>,
    ) -> Result<Option<Evaluation>, JobError> {
        let Some(eval) = &self.eval else {
            return Ok(None);
        };
        let started = Instant::now();
        let (rank, world) = self
            .group
            .as_ref()
            .map_or((0, 1), |g| (g.rank(), g.world()));
        let (mut sum, mut tokens) = (0.0f64, 0u64);
        for batch in eval.batches(self.opts.batch, rank, world) {
            sum += nll(&batch)?;
            tokens += trained_targets(&batch.targets) as u64;
        }
        if let Some(group) = &self.group {
            let mine = [sum.to_le_bytes(), tokens.to_le_bytes()].concat();
            let all = group.all_gather(&mine).map_err(|error| RankError {
                rank: group.rank(),
                error,
            })?;
            (sum, tokens) = (0.0, 0);
            for bytes in all {
                let (s, t) = bytes.split_at(8);
                sum += f64::from_le_bytes(s.try_into().expect("8 bytes"));
                tokens += u64::from_le_bytes(t[..8].try_into().expect("8 bytes"));
            }
        }
        Ok(Some(Evaluation {
            loss: sum / tokens.max(1) as f64,
            tokens: tokens as usize,
            seconds: started.elapsed().as_secs_f64(),
        }))
    }

    /// Records the evaluation after `done` steps: the best so far, its
    /// metrics line and progress line. Returns whether it is a new best.
    pub(super) fn evaluated(
        &mut self,
        done: usize,
        evaluation: Evaluation,
        progress: &mut Progress,
    ) -> Result<bool, JobError> {
        let best = self.best.is_none_or(|b| evaluation.loss < b.loss);
        if best {
            self.best = Some(BestEval {
                steps_done: done,
                loss: evaluation.loss,
            });
        }
        self.log(&EvalMetrics {
            step: done - 1,
            eval_loss: evaluation.loss,
            eval_perplexity: evaluation.loss.exp(),
            eval_tokens: evaluation.tokens,
            eval_s: evaluation.seconds,
            best,
        })?;
        progress.note(&format!(
            "eval after step {done}: loss {:.4}, perplexity {:.2} over {} tokens ({:.1} s){}",
            evaluation.loss,
            evaluation.loss.exp(),
            evaluation.tokens,
            evaluation.seconds,
            if best { ", the best so far" } else { "" }
        ));
        Ok(best)
    }

    /// Keeps `checkpoint` (the new best's) through rotation, in place of
    /// the one kept before.
    pub(super) fn pin_best(&mut self, checkpoint: Option<PathBuf>) -> Result<(), JobError> {
        match self.checkpoints.as_mut() {
            Some(dir) => Ok(dir.pin(checkpoint)?),
            None => Ok(()),
        }
    }

    /// After a resume: the best checkpoint the state names, pinned if the
    /// checkpoint folder still holds it.
    pub(super) fn pin_resumed_best(&mut self) -> Result<(), JobError> {
        let (Some(best), Some(dir)) = (self.best, self.checkpoints.as_ref()) else {
            return Ok(());
        };
        match best_checkpoint(dir.path(), best.steps_done) {
            Some(found) => self.pin_best(Some(found)),
            None => Ok(()),
        }
    }
}

/// The checkpoint in `dir` written after `steps_done` steps, if any.
fn best_checkpoint(dir: &Path, steps_done: usize) -> Option<PathBuf> {
    checkpoint::list(dir).ok()?.into_iter().rev().find(|path| {
        checkpoint::read_manifest(path).is_ok_and(|m| {
            m.trainer.get("steps_done").and_then(|s| s.as_u64()) == Some(steps_done as u64)
        })
    })
}
