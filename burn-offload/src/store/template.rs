//! The engine's template of a model (every parameter a zero-cost
//! placeholder) and the visitors that walk a model's parameters.

use std::collections::HashMap;
use std::marker::PhantomData;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{backend::Backend, Tensor};

use super::{Member, ParamGroup};

/// One float parameter as visited: id, module path and shape.
pub(crate) struct Visited {
    pub id: ParamId,
    pub name: String,
    pub shape: Vec<usize>,
}

/// How parameter values come back to the host when a model moves into a
/// store. The default reads through `into_data`; a device's own copy
/// machinery (`crate::transfer::Transfer`) reads through page-locked memory
/// where `into_data` is far slower (it dominated the initialisation of
/// multi-billion-parameter models on CUDA).
pub trait ReadBack {
    /// Copies `tensor` (f32 values) into `out`.
    fn read_back<B: Backend, const D: usize>(tensor: Tensor<B, D>, out: &mut [f32]) {
        let data = tensor.into_data().convert::<f32>();
        out.copy_from_slice(data.as_slice::<f32>().expect("f32 data"));
    }
}

/// Values of parameters the host already holds (a checkpoint's tensors in
/// memory-mapped files), taken into the store without a device: drawing them
/// instead would copy each to the device and back, and put the largest (an
/// f32 embedding table) on the device whole.
pub trait HostValues: Sync {
    /// Whether this source holds parameter `id`.
    fn holds(&self, id: ParamId) -> bool;

    /// Writes parameter `id`'s values (f32, burn's layout) into `out`; only
    /// called where [`HostValues::holds`] is true.
    fn read(&self, id: ParamId, out: &mut [f32]);
}

/// No values: every parameter is drawn on its device.
pub struct NoHostValues;

impl HostValues for NoHostValues {
    fn holds(&self, _id: ParamId) -> bool {
        false
    }

    fn read(&self, id: ParamId, _out: &mut [f32]) {
        unreachable!("NoHostValues holds no parameter ({id})")
    }
}

/// The parameter ids of each module, in visit order (each block's group).
pub(crate) fn param_ids<B: Backend, K: Module<B>>(modules: &[K]) -> Vec<Vec<ParamId>> {
    modules
        .iter()
        .map(|module| {
            let mut collect = Collect::default();
            module.visit(&mut collect);
            collect.out.into_iter().map(|p| p.id).collect()
        })
        .collect()
}

/// Takes each parameter's value into its slot and leaves a placeholder.
pub(super) struct Fill<'a, R> {
    pub groups: &'a mut [ParamGroup],
    pub slot_of: &'a HashMap<ParamId, (usize, Member)>,
    pub values: &'a dyn HostValues,
    pub read: PhantomData<R>,
}

impl<B: Backend, R: ReadBack> ModuleMapper<B> for Fill<'_, R> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, shape, device) = (
            param.id,
            param.lazy_shape().dims::<D>(),
            param.lazy_device(),
        );
        let (g, member) = self.slot_of[&id];
        let group = &mut self.groups[g];
        // A parameter the host holds is never drawn: a lazy one is dropped
        // uninitialised.
        let drawn = (!self.values.holds(id)).then(|| param.consume().1);
        let values = self.values;
        let read = |out: &mut [f32]| match drawn {
            Some(tensor) => R::read_back(tensor, out),
            None => values.read(id, out),
        };
        match member {
            Member::Trained(k) => {
                let range = group.slots[k].range();
                read(&mut group.params.as_mut_slice()[range]);
            }
            Member::Frozen(k) => {
                // Read in f32, then held in the frozen format.
                let mut values = vec![0.0; shape.iter().product()];
                read(&mut values);
                group.frozen.fill(k, &values);
            }
        }
        Param::initialized(id, placeholder::<B, D>(shape, &device))
    }
}

/// Collects every float parameter of a module in visit order, with its path
/// and shape (no value is read, and no lazy parameter drawn).
#[derive(Default)]
pub(crate) struct Collect {
    pub out: Vec<Visited>,
    path: Vec<String>,
}

impl<B: Backend> ModuleVisitor<B> for Collect {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // `lazy_shape`: reading a lazy parameter's shape must not draw it.
        self.out.push(Visited {
            id: param.id,
            name: self.path.join("."),
            shape: param.lazy_shape().dims::<D>().to_vec(),
        });
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
        let shape: [usize; D] = param.lazy_shape().dims();
        let device = param.lazy_device();
        Param::initialized(param.id, placeholder::<B, D>(shape, &device))
    }
}
