//! Tensors across the processes of a run ([`ProcessGroup`]): summed or
//! gathered through the machinery's collective where it has one (NCCL on
//! CUDA), else through the group's links, the stand-in on backends with no
//! collective library. The stand-in sums in rank order, each addition
//! rounded to the parts' dtype, as the in-process lanes' fallback adds
//! lane by lane: N processes compute what N lanes of one process do.

use burn::tensor::backend::Backend;
use burn::tensor::{bf16, f16, DType, Tensor, TensorData};

use super::{DeviceGrads, Transfer};
use crate::host::processes::{ProcessError, ProcessGroup};

/// `grads` (this process's, one lane's or its lanes' sum) summed over the
/// processes of `group`; every process gets the same sums.
pub fn all_reduce_grads<T: Transfer, B: Backend>(
    grads: DeviceGrads<B>,
    group: &ProcessGroup,
) -> Result<DeviceGrads<B>, ProcessError> {
    if group.world() == 1 {
        return Ok(grads);
    }
    let num_slots = grads.sums.len();
    // Every process runs the same block: a parameter has a gradient on all
    // of them or on none.
    let (present, parts): (Vec<usize>, Vec<Tensor<B, 1>>) = grads
        .sums
        .into_iter()
        .enumerate()
        .filter_map(|(k, sum)| sum.map(|sum| (k, sum)))
        .unzip();
    let summed = all_reduce::<T, B>(parts, group)?;
    let mut sums = vec![None; num_slots];
    for (k, sum) in present.into_iter().zip(summed) {
        sums[k] = Some(sum);
    }
    Ok(DeviceGrads { sums })
}

/// Each of `parts` summed over the processes of `group`.
pub fn all_reduce<T: Transfer, B: Backend>(
    parts: Vec<Tensor<B, 1>>,
    group: &ProcessGroup,
) -> Result<Vec<Tensor<B, 1>>, ProcessError> {
    if group.world() == 1 || parts.is_empty() {
        return Ok(parts);
    }
    let parts = match T::all_reduce(parts, group) {
        Ok(sums) => return Ok(sums),
        Err(parts) => parts,
    };
    let device = parts[0].device();
    // The stand-in adds f32, bf16 and f16; anything else is summed as f32.
    let parts: Vec<Tensor<B, 1>> = parts
        .into_iter()
        .map(|p| match p.dtype() {
            DType::F32 | DType::BF16 | DType::F16 => p,
            _ => p.cast(DType::F32),
        })
        .collect();
    let layout: Vec<(DType, usize)> = parts.iter().map(|p| (p.dtype(), p.dims()[0])).collect();
    let mut mine = Vec::new();
    for part in parts {
        mine.extend_from_slice(part.into_data().as_bytes());
    }
    let all = group.all_gather(&mine)?;
    if let Some(rank) = all.iter().position(|bytes| bytes.len() != mine.len()) {
        return Err(ProcessError::Disagree {
            rank,
            what: "gradient layout".into(),
        });
    }
    let mut at = 0;
    let mut sums = Vec::with_capacity(layout.len());
    for (dtype, len) in layout {
        let bytes = len * dtype.size();
        let values = |rank: usize| {
            TensorData::from_bytes_vec(all[rank][at..at + bytes].to_vec(), [len], dtype)
                .convert::<f32>()
                .into_vec::<f32>()
                .expect("f32 values")
        };
        let mut sum = values(0);
        for rank in 1..all.len() {
            for (s, v) in sum.iter_mut().zip(values(rank)) {
                *s = round_to(*s + v, dtype);
            }
        }
        at += bytes;
        let data = TensorData::new(sum, [len]).convert_dtype(dtype);
        sums.push(Tensor::from_data(data, &device));
    }
    Ok(sums)
}

/// Every process's `tensor` (one shape and dtype on all), in rank order, on
/// this process's device.
pub fn all_gather<T: Transfer, B: Backend, const D: usize>(
    tensor: Tensor<B, D>,
    group: &ProcessGroup,
) -> Result<Vec<Tensor<B, D>>, ProcessError> {
    if group.world() == 1 {
        return Ok(vec![tensor]);
    }
    let shape = tensor.shape();
    let len = shape.num_elements();
    let device = tensor.device();
    let flat = match T::all_gather(tensor.reshape([len]), group) {
        Ok(all) => {
            return Ok((0..group.world())
                .map(|r| all.clone().narrow(0, r * len, len).reshape(shape.clone()))
                .collect())
        }
        Err(flat) => flat,
    };
    let data = flat.into_data();
    let dtype = data.dtype;
    let all = group.all_gather(data.as_bytes())?;
    all.into_iter()
        .enumerate()
        .map(|(rank, bytes)| {
            if bytes.len() != len * dtype.size() {
                return Err(ProcessError::Disagree {
                    rank,
                    what: format!("tensor of shape {shape:?}"),
                });
            }
            let data = TensorData::from_bytes_vec(bytes, shape.clone(), dtype);
            Ok(Tensor::from_data(data, &device))
        })
        .collect()
}

/// `value` rounded to `dtype`, as an addition in that dtype rounds it.
fn round_to(value: f32, dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => bf16::from_f32(value).to_f32(),
        DType::F16 => f16::from_f32(value).to_f32(),
        _ => value,
    }
}
