//! Loading a Hugging Face checkpoint's weights: lazily into a model, or
//! into an engine's host store without a device.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::{backend::Backend, Tensor};
use burn_offload::HostValues;

use super::{check_all, Checkpoint, HfError};
use crate::ModelConfig;

/// Loads a checkpoint's weights into `model` (built from [`crate::hf::load_config`]'s
/// config). Parameters are never initialised randomly first: burn's lazy
/// parameters are replaced, after every tensor is checked, by lazy ones that
/// read the checkpoint when first used. The offload engine takes them one at
/// a time into its host store, so a model larger than the GPU is never on it
/// whole (an eager load put a 70B model's 282 GB of f32 on the device).
pub fn load_weights<B: Backend, M: Module<B>>(
    model: M,
    config: &ModelConfig,
    dir: &Path,
) -> Result<M, HfError> {
    Ok(load_weights_for_store(model, config, dir)?.0)
}

/// [`load_weights`], with the checkpoint's tensors by parameter id for an
/// offload engine to take straight into its host store
/// ([`burn_offload::Engine::with_host_values`]): none is copied to a device
/// and back, and a model whose largest tensor does not fit the device loads.
pub fn load_weights_for_store<B: Backend, M: Module<B>>(
    model: M,
    config: &ModelConfig,
    dir: &Path,
) -> Result<(M, CheckpointValues), HfError> {
    let checkpoint = Arc::new(Checkpoint::open(dir)?);
    check_all(&model, config, &checkpoint)?;
    let mut fill = Fill {
        checkpoint: &checkpoint,
        config,
        path: Vec::new(),
        by_id: HashMap::new(),
    };
    let model = model.map(&mut fill);
    let by_id = fill.by_id;
    Ok((model, CheckpointValues { checkpoint, by_id }))
}

/// A checkpoint's tensors by the id of the parameter each fills.
pub struct CheckpointValues {
    checkpoint: Arc<Checkpoint>,
    /// Parameter id → (tensor name, burn's shape, stored transposed).
    by_id: HashMap<ParamId, (String, Vec<usize>, bool)>,
}

impl HostValues for CheckpointValues {
    fn holds(&self, id: ParamId) -> bool {
        self.by_id.contains_key(&id)
    }

    fn read(&self, id: ParamId, out: &mut [f32]) {
        let (name, dims, transpose) = &self.by_id[&id];
        self.checkpoint
            .read_into(name, dims, *transpose, out)
            .unwrap_or_else(|e| panic!("checked when loading began: {e}"));
    }
}

/// Replaces every parameter of `model` by a lazy one that reads its tensor
/// from the checkpoint when first used (each checked by [`check_all`]
/// first).
struct Fill<'a> {
    checkpoint: &'a Arc<Checkpoint>,
    config: &'a ModelConfig,
    path: Vec<String>,
    by_id: HashMap<ParamId, (String, Vec<usize>, bool)>,
}

impl<B: Backend> ModuleMapper<B> for Fill<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (name, transpose) = self.checkpoint.name_of(self.config, &self.path.join("."));
        let shape = param.lazy_shape();
        let dims: Vec<usize> = shape.iter().copied().collect();
        self.by_id
            .insert(param.id, (name.clone(), dims.clone(), transpose));
        let checkpoint = Arc::clone(self.checkpoint);
        let read = move |device: &B::Device, require_grad: bool| {
            let data = checkpoint
                .read(&name, &dims, transpose)
                .unwrap_or_else(|e| panic!("checked when loading began: {e}"));
            let tensor = Tensor::from_data(data, device);
            if require_grad {
                tensor.require_grad()
            } else {
                tensor
            }
        };
        // Loaded weights are trainable (a no-op outside `Autodiff`).
        Param::uninitialized(param.id, read, param.lazy_device(), true, shape)
    }
}
