//! Sums across GPUs with NCCL, for the engine's lanes: one communicator per
//! set of devices, made once for the process with `ncclCommInitAll` (one
//! thread drives every device), and each call's reductions in one NCCL
//! group, queued on every device's compute stream behind the kernels that
//! produced the parts, so nothing waits on the host. Across the processes
//! of a run (one GPU each), one communicator per process from
//! `ncclCommInitRank`, for all-reduces and all-gathers on the same terms.

use std::any::Any;
use std::ffi::c_void;
use std::sync::Mutex;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::tensor::CubeTensor;
use cudarc::nccl::sys;

use super::copier::{bind_context, device_ptr_and_stream};
use super::nccl;
use super::types::{as_cuda, cuda_as, is_cuda};
use crate::host::processes::{ProcessError, ProcessGroup};

/// The communicators of one set of devices, rank `d` on `devices[d]`.
struct Communicators {
    devices: Vec<usize>,
    comms: Vec<sys::ncclComm_t>,
}

// SAFETY: a communicator is an opaque handle NCCL lets any thread use (one
// at a time: every use is under `COMMUNICATORS`' lock).
unsafe impl Send for Communicators {}

static COMMUNICATORS: Mutex<Vec<Communicators>> = Mutex::new(Vec::new());

/// The CUDA devices of `devices` when `X` is CUDA and they are two or more
/// distinct GPUs (NCCL takes each GPU once; lanes that share one sum with
/// burn's ops).
fn distinct_gpus<X: Backend>(devices: &[X::Device]) -> Option<Vec<CudaDevice>> {
    if !is_cuda::<X>() || devices.len() < 2 {
        return None;
    }
    let gpus: Vec<CudaDevice> = devices
        .iter()
        .map(|d| (d as &dyn Any).downcast_ref::<CudaDevice>().cloned())
        .collect::<Option<_>>()?;
    let mut indices: Vec<usize> = gpus.iter().map(|d| d.index).collect();
    indices.sort_unstable();
    indices.dedup();
    (indices.len() == gpus.len()).then_some(gpus)
}

/// Whether the lanes on `devices` can sum their gradients: always, but on
/// distinct GPUs only where the NCCL library loads.
pub(crate) fn can_reduce<X: Backend>(devices: &[X::Device]) -> bool {
    distinct_gpus::<X>(devices).is_none() || nccl::is_present()
}

/// [`crate::transfer::Transfer::reduce`] on CUDA: each slot's parts (one per
/// lane, on distinct GPUs, f32 or bf16) summed by `ncclReduce` into a new
/// tensor on lane `root`'s GPU. `Err(slots)` for anything else.
#[allow(clippy::type_complexity)]
pub(crate) fn try_reduce<X: Backend>(
    slots: Vec<Vec<Tensor<X, 1>>>,
    root: usize,
) -> Result<Vec<Tensor<X, 1>>, Vec<Vec<Tensor<X, 1>>>> {
    let Some(first) = slots.first() else {
        return Ok(Vec::new());
    };
    let devices: Vec<X::Device> = first.iter().map(Tensor::device).collect();
    let Some(gpus) = distinct_gpus::<X>(&devices) else {
        return Err(slots);
    };
    let reducible = slots.iter().all(|parts| {
        parts.len() == gpus.len()
            && parts
                .iter()
                .zip(&devices)
                .all(|(p, d)| p.device() == *d && matches!(p.dtype(), DType::F32 | DType::BF16))
    });
    if !reducible {
        return Err(slots);
    }
    let indices: Vec<usize> = gpus.iter().map(|d| d.index).collect();
    let mut registry = COMMUNICATORS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let at = match registry.iter().position(|c| c.devices == indices) {
        Some(at) => at,
        None => {
            registry.push(init_communicators(&indices));
            registry.len() - 1
        }
    };
    let comms = &registry[at].comms;
    let mut sums = Vec::with_capacity(slots.len());
    // The parts stay alive until the reductions are queued; their buffers go
    // back to cubecl's pools after, reused only by work queued behind them.
    let mut parts_kept = Vec::with_capacity(slots.len());
    let mut calls = Vec::with_capacity(slots.len());
    for parts in slots {
        let dtype = parts[root].dtype();
        let len = parts[root].dims()[0];
        let cubes: Vec<CubeTensor<CudaRuntime>> = parts
            .into_iter()
            .map(|p| {
                let p = as_cuda(p).unwrap_or_else(|_| unreachable!("checked: CUDA tensors"));
                burn_cubecl::kernel::into_contiguous(p.into_primitive().tensor())
            })
            .collect();
        let sum: Tensor<super::CudaBackend, 1> = Tensor::empty([len], (&gpus[root], dtype));
        let sum = sum.into_primitive().tensor();
        let lanes: Vec<(u64, u64)> = cubes
            .iter()
            .enumerate()
            .map(|(d, cube)| {
                bind_context(&gpus[d]);
                let (ptr, stream) = device_ptr_and_stream(cube);
                (ptr, stream as u64)
            })
            .collect();
        bind_context(&gpus[root]);
        let (out, _) = device_ptr_and_stream(&sum);
        calls.push((lanes, out, len, dtype));
        parts_kept.push(cubes);
        sums.push(sum);
    }
    nccl::group_start().unwrap_or_else(|e| panic!("ncclGroupStart failed: {e:?}"));
    for (lanes, out, len, dtype) in &calls {
        for (d, (ptr, stream)) in lanes.iter().enumerate() {
            let recv = if d == root { *out } else { *ptr };
            // SAFETY: live device buffers of `len` elements on each lane's
            // GPU (kept until after the group), the streams cubecl computes
            // on there, and this set of devices' communicators.
            unsafe {
                nccl::reduce(
                    *ptr as *const c_void,
                    recv as *mut c_void,
                    *len,
                    nccl_dtype(*dtype),
                    sys::ncclRedOp_t::ncclSum,
                    root as i32,
                    comms[d],
                    *stream as sys::cudaStream_t,
                )
            }
            .unwrap_or_else(|e| panic!("ncclReduce on GPU {} failed: {e:?}", gpus[d].index));
        }
    }
    nccl::group_end().unwrap_or_else(|e| panic!("ncclGroupEnd failed: {e:?}"));
    drop(parts_kept);
    Ok(sums
        .into_iter()
        .map(|sum| {
            cuda_as::<X, 1>(Tensor::from_primitive(
                burn::tensor::TensorPrimitive::Float(sum),
            ))
            .unwrap_or_else(|| unreachable!("checked: X is CUDA"))
        })
        .collect())
}

/// One communicator per GPU of `indices`, ranks in that order.
fn init_communicators(indices: &[usize]) -> Communicators {
    let mut comms = vec![std::ptr::null_mut(); indices.len()];
    let devlist: Vec<i32> = indices.iter().map(|&i| i as i32).collect();
    // SAFETY: room for one communicator per device in the list.
    unsafe { nccl::comm_init_all(comms.as_mut_ptr(), devlist.len() as i32, devlist.as_ptr()) }
        .unwrap_or_else(|e| panic!("ncclCommInitAll over GPUs {indices:?} failed: {e:?}"));
    Communicators {
        devices: indices.to_vec(),
        comms,
    }
}

/// This process's NCCL communicator in a group of processes (one GPU each),
/// made from the unique id rank 0 draws and hands out over the group's links.
struct ProcessComm {
    /// The GPU it was made on.
    gpu: usize,
    comm: sys::ncclComm_t,
}

// SAFETY: an opaque handle NCCL lets any thread use, one at a time: the
// engine's one driving thread makes every collective call.
unsafe impl Send for ProcessComm {}
unsafe impl Sync for ProcessComm {}

/// Why this process's communicator could not be made (the group's first
/// collective panics with it, naming the rank).
#[derive(Debug, thiserror::Error)]
enum ProcessCommError {
    /// Rank 0's unique id did not reach every rank.
    #[error("handing out NCCL's unique id: {0}")]
    Broadcast(#[source] ProcessError),
    /// Rank 0 had no unique id to hand out.
    #[error("rank 0 could not draw NCCL's unique id")]
    NoUniqueId,
    /// `ncclCommInitRank` failed.
    #[error("ncclCommInitRank on GPU {gpu} failed: {error:?}")]
    InitRank {
        /// The GPU it was made on.
        gpu: usize,
        /// What NCCL said.
        error: nccl::NcclError,
    },
}

/// The group's communicator, made on `gpu` by its first collective (every
/// rank reaches it at the same point of the run).
fn process_comm<'g>(group: &'g ProcessGroup, gpu: &CudaDevice) -> &'g ProcessComm {
    let made = group.device_state(|| -> Result<ProcessComm, ProcessCommError> {
        let id = nccl::get_unique_id();
        // Every rank takes part in the exchange, whatever rank 0 drew.
        let mine: Vec<u8> = match &id {
            Ok(id) => id.internal.iter().map(|&c| c as u8).collect(),
            Err(_) => Vec::new(),
        };
        let shared = group
            .broadcast(&mine)
            .map_err(ProcessCommError::Broadcast)?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        if shared.len() != id.internal.len() {
            return Err(ProcessCommError::NoUniqueId);
        }
        for (slot, byte) in id.internal.iter_mut().zip(shared) {
            *slot = byte as _;
        }
        bind_context(gpu);
        let mut comm = std::ptr::null_mut();
        // SAFETY: room for one communicator; the id is rank 0's.
        unsafe { nccl::comm_init_rank(&mut comm, group.world() as i32, id, group.rank() as i32) }
            .map_err(|error| ProcessCommError::InitRank {
            gpu: gpu.index,
            error,
        })?;
        Ok(ProcessComm {
            gpu: gpu.index,
            comm,
        })
    });
    match made {
        Some(Ok(comm)) if comm.gpu == gpu.index => comm,
        Some(Ok(comm)) => panic!(
            "the process group's NCCL communicator is on GPU {}, not GPU {}",
            comm.gpu, gpu.index
        ),
        Some(Err(why)) => panic!("rank {}: {why}", group.rank()),
        None => panic!("the process group holds another device's collective state"),
    }
}

/// The one CUDA device of `parts` (f32 or bf16 each), when `X` is CUDA.
fn one_gpu<X: Backend>(parts: &[Tensor<X, 1>]) -> Option<CudaDevice> {
    if !is_cuda::<X>() {
        return None;
    }
    let device = parts.first()?.device();
    let gpu = (&device as &dyn Any).downcast_ref::<CudaDevice>()?.clone();
    parts
        .iter()
        .all(|p| p.device() == device && matches!(p.dtype(), DType::F32 | DType::BF16))
        .then_some(gpu)
}

fn nccl_dtype(dtype: DType) -> sys::ncclDataType_t {
    match dtype {
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        _ => sys::ncclDataType_t::ncclFloat32,
    }
}

/// A part as a contiguous CUDA tensor, and a new output tensor of `len`
/// elements of its dtype on `gpu`.
fn part_and_output<X: Backend>(
    part: Tensor<X, 1>,
    len: usize,
    gpu: &CudaDevice,
) -> (CubeTensor<CudaRuntime>, CubeTensor<CudaRuntime>) {
    let dtype = part.dtype();
    let part = as_cuda(part).unwrap_or_else(|_| unreachable!("checked: CUDA tensors"));
    let part = burn_cubecl::kernel::into_contiguous(part.into_primitive().tensor());
    let out: Tensor<super::CudaBackend, 1> = Tensor::empty([len], (gpu, dtype));
    (part, out.into_primitive().tensor())
}

fn as_x<X: Backend>(tensor: CubeTensor<CudaRuntime>) -> Tensor<X, 1> {
    cuda_as::<X, 1>(Tensor::from_primitive(
        burn::tensor::TensorPrimitive::Float(tensor),
    ))
    .unwrap_or_else(|| unreachable!("checked: X is CUDA"))
}

/// [`crate::transfer::Transfer::all_reduce`] on CUDA: `ncclAllReduce` of
/// every part in one NCCL group, on the compute stream. `Err(parts)` for
/// anything but f32 or bf16 CUDA tensors on one GPU.
#[allow(clippy::type_complexity)]
pub(crate) fn try_all_reduce<X: Backend>(
    parts: Vec<Tensor<X, 1>>,
    group: &ProcessGroup,
) -> Result<Vec<Tensor<X, 1>>, Vec<Tensor<X, 1>>> {
    let Some(gpu) = one_gpu(&parts) else {
        return Err(parts);
    };
    let comm = process_comm(group, &gpu).comm;
    let mut calls = Vec::with_capacity(parts.len());
    for part in parts {
        let (dtype, len) = (part.dtype(), part.dims()[0]);
        let (part, sum) = part_and_output(part, len, &gpu);
        calls.push((part, sum, len, dtype));
    }
    bind_context(&gpu);
    nccl::group_start().unwrap_or_else(|e| panic!("ncclGroupStart failed: {e:?}"));
    for (part, sum, len, dtype) in &calls {
        let (send, stream) = device_ptr_and_stream(part);
        let (recv, _) = device_ptr_and_stream(sum);
        // SAFETY: live buffers of `len` elements on this GPU (kept until
        // after the group), the stream cubecl computes on, the group's
        // communicator.
        unsafe {
            nccl::all_reduce(
                send as *const c_void,
                recv as *mut c_void,
                *len,
                nccl_dtype(*dtype),
                sys::ncclRedOp_t::ncclSum,
                comm,
                stream as sys::cudaStream_t,
            )
        }
        .unwrap_or_else(|e| panic!("ncclAllReduce on GPU {} failed: {e:?}", gpu.index));
    }
    nccl::group_end().unwrap_or_else(|e| panic!("ncclGroupEnd failed: {e:?}"));
    Ok(calls.into_iter().map(|(_, sum, ..)| as_x(sum)).collect())
}

/// [`crate::transfer::Transfer::all_gather`] on CUDA: `ncclAllGather` on the
/// compute stream into a tensor of `world ×` the part's length.
pub(crate) fn try_all_gather<X: Backend>(
    part: Tensor<X, 1>,
    group: &ProcessGroup,
) -> Result<Tensor<X, 1>, Tensor<X, 1>> {
    let Some(gpu) = one_gpu(std::slice::from_ref(&part)) else {
        return Err(part);
    };
    let comm = process_comm(group, &gpu).comm;
    let (dtype, len) = (part.dtype(), part.dims()[0]);
    let (part, all) = part_and_output(part, len * group.world(), &gpu);
    bind_context(&gpu);
    let (send, stream) = device_ptr_and_stream(&part);
    let (recv, _) = device_ptr_and_stream(&all);
    // SAFETY: as in `try_all_reduce`; the output holds every rank's part.
    unsafe {
        nccl::all_gather(
            send as *const c_void,
            recv as *mut c_void,
            len,
            nccl_dtype(dtype),
            comm,
            stream as sys::cudaStream_t,
        )
    }
    .unwrap_or_else(|e| panic!("ncclAllGather on GPU {} failed: {e:?}", gpu.index));
    drop(part);
    Ok(as_x(all))
}
