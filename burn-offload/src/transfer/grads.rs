//! Gradients on their way from a bound module to the host: read at once,
//! queued behind the backward that produces them, or summed on the device
//! over several backward passes first.

use std::collections::HashSet;

use burn::module::{ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{bf16, DType, Tensor};
use rayon::prelude::*;

use super::{on_device, PagerStats, QueuedRead, Transfer};
use crate::host::bf16::round_into_par;
use crate::host::rows::write_into;
use crate::store::{Member, ParamGroup};

/// A bound block's gradients on their way to the host
/// ([`super::Pager::start_gradients`]).
pub struct PendingGradients<T: Transfer> {
    /// Per slot of the group, in visit order: its range in the group's buffer
    /// and what arrives there (`None`: the parameter got no gradient).
    pub(super) slots: Vec<(std::ops::Range<usize>, Option<PendingGrad<T>>)>,
}

impl<T: Transfer> PendingGradients<T> {
    /// Whether slot `k` of the group (visit order) got a gradient.
    pub fn has_gradient(&self, k: usize) -> bool {
        self.slots[k].1.is_some()
    }

    /// Waits for the copies and writes them over `out` (`out.len() ==
    /// group.numel()`; zeros where a parameter got no gradient), or adds
    /// them to it with `accumulate`. Any thread may finish them.
    pub fn finish(self, out: &mut [f32], accumulate: bool) {
        for (range, grad) in self.slots {
            let out = &mut out[range];
            match grad {
                None if accumulate => {}
                None => out.par_chunks_mut(1 << 16).for_each(|c| c.fill(0.0)),
                Some(grad) => grad.finish(out, accumulate),
            }
        }
    }

    /// [`PendingGradients::finish`] into a bf16 buffer, written over: for
    /// gradients computed in bf16, whose values arrive unchanged.
    pub fn finish_bf16(self, out: &mut [bf16]) {
        for (range, grad) in self.slots {
            let out = &mut out[range];
            match grad {
                None => out.par_chunks_mut(1 << 16).for_each(|c| c.fill(bf16::ZERO)),
                Some(PendingGrad::Queued(read)) => read.finish_bf16(out),
                Some(PendingGrad::Read(values)) => round_into_par(out, &values),
            }
        }
    }
}

/// One gradient on its way to the host.
pub(super) enum PendingGrad<T: Transfer> {
    /// A copy queued on the device behind the backward.
    Queued(T::Read),
    /// Read at once (no queued copies on this backend).
    Read(Vec<f32>),
}

impl<T: Transfer> PendingGrad<T> {
    /// Waits for the values and writes (or adds) them into `out`.
    pub(super) fn finish(self, out: &mut [f32], accumulate: bool) {
        match self {
            PendingGrad::Queued(read) => read.finish(out, accumulate),
            PendingGrad::Read(values) => write_into(out, &values, accumulate),
        }
    }
}

/// Starts the copy of one gradient to the host: queued behind the work that
/// produces it where `T` can, read at once elsewhere.
pub(super) fn start_read<T: Transfer, X: Backend, const D: usize>(
    grad: Tensor<X, D>,
    beside: bool,
    stats: &mut PagerStats,
) -> PendingGrad<T> {
    let grad = match T::start_read(grad, beside) {
        Ok(read) => {
            stats.bytes_to_host += read.bytes();
            return PendingGrad::Queued(read);
        }
        Err(grad) => grad,
    };
    stats.bytes_to_host += (grad.shape().num_elements() * grad.dtype().size()) as u64;
    let data = grad.into_data().convert::<f32>();
    PendingGrad::Read(data.into_vec::<f32>().expect("f32 gradient"))
}

/// The gradients of one group summed on the device over several backward
/// passes (the LM head's loss chunks), in f32, one flat tensor per slot in
/// visit order (`None`: no gradient yet). The sum crosses to the host once.
pub struct DeviceGrads<B: Backend> {
    pub(super) sums: Vec<Option<Tensor<B, 1>>>,
}

impl<B: Backend> DeviceGrads<B> {
    /// No gradient yet for any of `group`'s slots.
    pub fn new(group: &ParamGroup) -> Self {
        Self {
            sums: vec![None; group.slots.len()],
        }
    }
}

/// Sums each lane's gradients of one group (`lanes[d]` on lane `d`'s
/// device) onto lane `root`'s device: through `T`'s collective where it has
/// one, else with burn's own ops (each part moved to the root device, then
/// added in lane order), the in-process sum that stands in for it.
pub fn sum_lanes<T: Transfer, B: Backend>(
    lanes: Vec<DeviceGrads<B>>,
    root: usize,
) -> DeviceGrads<B> {
    let num_slots = lanes[0].sums.len();
    let mut present = vec![true; num_slots];
    let mut slots: Vec<Vec<Tensor<B, 1>>> = (0..num_slots).map(|_| Vec::new()).collect();
    for lane in lanes {
        for (k, sum) in lane.sums.into_iter().enumerate() {
            match sum {
                Some(sum) => slots[k].push(sum),
                None => present[k] = false,
            }
        }
    }
    // Every lane runs the same block, so a parameter has a gradient on all
    // of them or on none.
    let (summed, kept): (Vec<usize>, Vec<Vec<Tensor<B, 1>>>) = slots
        .into_iter()
        .enumerate()
        .filter(|(k, parts)| present[*k] && !parts.is_empty())
        .unzip();
    let reduced = T::reduce(kept, root).unwrap_or_else(|slots| {
        slots
            .into_iter()
            .map(|parts| {
                // Lanes that share a device, or a backend without a
                // collective: parts elsewhere come through host memory.
                let device = parts[root].device();
                parts
                    .into_iter()
                    .map(|part| on_device(part, &device))
                    .reduce(|a, b| a + b)
                    .expect("one part per lane")
            })
            .collect()
    });
    let mut sums = vec![None; num_slots];
    for (k, sum) in summed.into_iter().zip(reduced) {
        sums[k] = Some(sum);
    }
    DeviceGrads { sums }
}

/// Adds `value` to a running sum on the device (`None`: nothing summed yet).
pub fn add_to<B: Backend, const D: usize>(sum: &mut Option<Tensor<B, D>>, value: Tensor<B, D>) {
    *sum = Some(match sum.take() {
        Some(sum) => sum + value,
        None => value,
    });
}

/// Queues each parameter's gradient copy ([`super::Pager::start_gradients`]).
pub(super) struct GradsStart<'a, B: AutodiffBackend, T: Transfer> {
    pub group: &'a ParamGroup,
    pub next: usize,
    pub grads: &'a B::Gradients,
    pub beside: bool,
    pub slots: Vec<(std::ops::Range<usize>, Option<PendingGrad<T>>)>,
    pub stats: &'a mut PagerStats,
}

impl<B: AutodiffBackend, T: Transfer> ModuleVisitor<B> for GradsStart<'_, B, T> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let slot = self.group.trained_slot(self.next);
        self.next += 1;
        let Some(slot) = slot else {
            return;
        };
        let range = slot.range();
        let grad = param
            .val()
            .grad(self.grads)
            .map(|grad| start_read::<T, _, D>(grad, self.beside, self.stats));
        self.slots.push((range, grad));
    }
}

/// Takes each parameter's gradient, flat, in its dtype ([`super::Pager::flat_gradients`]).
pub(super) struct GradsFlat<'a, B: AutodiffBackend> {
    pub group: &'a ParamGroup,
    pub next: usize,
    pub grads: &'a B::Gradients,
    pub flat: DeviceGrads<B::InnerBackend>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradsFlat<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let member = self.group.member(self.next);
        self.next += 1;
        let Member::Trained(k) = member else {
            return;
        };
        let len = self.group.slots[k].len;
        self.flat.sums[k] = param.val().grad(self.grads).map(|grad| grad.reshape([len]));
    }
}

/// Adds each parameter's gradient to a device sum ([`super::Pager::keep_gradients`]).
pub(super) struct GradsKeep<'a, B: AutodiffBackend> {
    pub group: &'a ParamGroup,
    pub next: usize,
    pub skip: &'a HashSet<ParamId>,
    pub grads: &'a B::Gradients,
    pub kept: &'a mut DeviceGrads<B::InnerBackend>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradsKeep<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.skip.contains(&param.id) {
            return;
        }
        let member = self.group.member(self.next);
        self.next += 1;
        let Member::Trained(k) = member else {
            return;
        };
        let slot = &self.group.slots[k];
        let sum = &mut self.kept.sums[k];
        let Some(grad) = param.val().grad(self.grads) else {
            return;
        };
        add_to(sum, grad.reshape([slot.len]).cast(DType::F32));
    }
}

/// Reads each parameter's gradient into the host buffer, waiting for it
/// ([`super::Pager::gradients_to_host`]).
pub(super) struct GradsOut<'a, B: AutodiffBackend, T: Transfer> {
    pub group: &'a ParamGroup,
    pub next: usize,
    pub skip: &'a HashSet<ParamId>,
    pub grads: &'a B::Gradients,
    pub out: &'a mut [f32],
    pub accumulate: bool,
    pub stats: &'a mut PagerStats,
    pub transfer: std::marker::PhantomData<T>,
}

impl<B: AutodiffBackend, T: Transfer> ModuleVisitor<B> for GradsOut<'_, B, T> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.skip.contains(&param.id) {
            return;
        }
        let slot = self.group.trained_slot(self.next);
        self.next += 1;
        let Some(slot) = slot else {
            return;
        };
        let out = &mut self.out[slot.range()];
        let Some(grad) = param.val().grad(self.grads) else {
            if !self.accumulate {
                out.fill(0.0);
            }
            return;
        };
        let grad = match T::read_into(grad, out, self.accumulate) {
            Ok(copy) => return self.stats.timed_download(copy.bytes, copy.time),
            Err(grad) => grad,
        };
        self.stats.bytes_to_host += (out.len() * grad.dtype().size()) as u64;
        let data = grad.into_data().convert::<f32>();
        write_into(
            out,
            data.as_slice::<f32>().expect("f32 gradient"),
            self.accumulate,
        );
    }
}
