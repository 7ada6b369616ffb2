//! The `Pager`: moves parameter groups between the host store and the compute
//! device, and keeps the books (bytes each way, what is resident, the peak).
//!
//! Binding a group means building the module the engine runs: a clone of the
//! stateless template (whose parameters are zero-cost placeholders) with every
//! parameter of the group replaced, in visit order, by a device tensor made
//! from the group's slab. Gradients come back the same way, positionally.

use std::collections::HashSet;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use crate::store::ParamGroup;

/// Byte counters of the pager.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagerStats {
    /// Parameter bytes copied host → device.
    pub bytes_to_device: u64,
    /// Gradient bytes copied device → host.
    pub bytes_to_host: u64,
    /// Parameter bytes resident on the device now.
    pub resident_bytes: u64,
    /// Largest `resident_bytes` seen since the last reset.
    pub peak_resident_bytes: u64,
}

/// Residency and traffic of parameter groups.
#[derive(Debug, Default)]
pub struct Pager {
    resident: Vec<(usize, u64)>,
    stats: PagerStats,
}

impl Pager {
    pub fn stats(&self) -> PagerStats {
        self.stats
    }

    /// Forgets the traffic counters and the peak (residency stays).
    pub fn reset_counters(&mut self) {
        let resident = self.stats.resident_bytes;
        self.stats = PagerStats {
            resident_bytes: resident,
            peak_resident_bytes: resident,
            ..Default::default()
        };
    }

    /// Binds `group` into `template` (on any backend: the inner one for
    /// graph-free forward, `Autodiff<_>` with `require_grad` for recompute).
    /// `skip` lists parameters that belong to other groups (the blocks, when
    /// binding the stem into the whole model).
    pub fn bind<B: Backend, M: Module<B>>(
        &mut self,
        template: M,
        group_index: usize,
        group: &ParamGroup,
        skip: &HashSet<ParamId>,
        require_grad: bool,
        device: &B::Device,
    ) -> M {
        let mut bind = Bind {
            group,
            next: 0,
            skip,
            device,
            require_grad,
        };
        let module = template.map(&mut bind);
        debug_assert_eq!(bind.next, group.slots.len(), "template and group disagree");
        self.page_in(group_index, group.param_bytes() as u64);
        module
    }

    fn page_in(&mut self, group: usize, bytes: u64) {
        self.stats.bytes_to_device += bytes;
        if !self.resident.iter().any(|(g, _)| *g == group) {
            self.resident.push((group, bytes));
            self.stats.resident_bytes += bytes;
            self.stats.peak_resident_bytes = self
                .stats
                .peak_resident_bytes
                .max(self.stats.resident_bytes);
        }
    }

    /// Records that the engine dropped every module bound from `group`.
    pub fn evict(&mut self, group: usize) {
        if let Some(pos) = self.resident.iter().position(|(g, _)| *g == group) {
            let (_, bytes) = self.resident.swap_remove(pos);
            self.stats.resident_bytes -= bytes;
        }
    }

    /// Copies the gradients of a bound module's parameters (those of `group`,
    /// in visit order) to the host, adding them into `out`
    /// (`out.len() == group.numel()`). A parameter without a gradient adds nothing.
    pub fn gradients_to_host<B: AutodiffBackend, M: Module<B>>(
        &mut self,
        module: &M,
        group: &ParamGroup,
        skip: &HashSet<ParamId>,
        grads: &B::Gradients,
        out: &mut [f32],
    ) {
        let mut visit = GradsOut {
            group,
            next: 0,
            skip,
            grads,
            out,
            bytes: 0,
        };
        module.visit(&mut visit);
        self.stats.bytes_to_host += visit.bytes;
    }
}

/// A template parameter costs nothing: a single zero broadcast to the shape.
pub fn placeholder<B: Backend, const D: usize>(
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::<B, D>::zeros([1; D], device).expand(shape)
}

/// Replaces every float parameter of a module with a placeholder of its shape.
pub struct ToPlaceholders;

impl<B: Backend> ModuleMapper<B> for ToPlaceholders {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let shape: [usize; D] = param.shape().dims();
        let device = param.lazy_device();
        Param::initialized(param.id, placeholder::<B, D>(shape, &device))
    }
}

struct Bind<'a, B: Backend> {
    group: &'a ParamGroup,
    next: usize,
    skip: &'a HashSet<ParamId>,
    device: &'a B::Device,
    require_grad: bool,
}

impl<B: Backend> ModuleMapper<B> for Bind<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.skip.contains(&param.id) {
            return param;
        }
        let slot = &self.group.slots[self.next];
        self.next += 1;
        let values = self.group.params.as_slice()[slot.offset..slot.offset + slot.len].to_vec();
        let tensor =
            Tensor::<B, D>::from_data(TensorData::new(values, slot.shape.clone()), self.device);
        Param::initialized(param.id, tensor.set_require_grad(self.require_grad))
    }
}

struct GradsOut<'a, B: AutodiffBackend> {
    group: &'a ParamGroup,
    next: usize,
    skip: &'a HashSet<ParamId>,
    grads: &'a B::Gradients,
    out: &'a mut [f32],
    bytes: u64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradsOut<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.skip.contains(&param.id) {
            return;
        }
        let slot = &self.group.slots[self.next];
        self.next += 1;
        let Some(grad) = param.val().grad(self.grads) else {
            return;
        };
        let values = grad
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32 gradient");
        self.bytes += (values.len() * std::mem::size_of::<f32>()) as u64;
        let out = &mut self.out[slot.offset..slot.offset + slot.len];
        for (o, g) in out.iter_mut().zip(values) {
            *o += g;
        }
    }
}
