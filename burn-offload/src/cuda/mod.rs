//! Everything that knows burn's CUDA backend: host↔device copies through
//! page-locked memory on streams of their own (the pager's [`CudaTransfer`]),
//! cuBLAS and cubek matmul kernels for `Gemm<Cuda>`, and the glue our CubeCL
//! kernels launch through. The rest of the crate reaches CUDA only through
//! this module's facade.

mod collective;
mod copier;
mod dequant;
mod device;
mod download;
mod kernels;
mod matmul;
mod nccl;
mod transfer;
mod types;
mod upload;

pub use dequant::{dequantize_int8_cuda, dequantize_nf4_cuda};
pub use device::{device_count, free_device_bytes, limit_memory_pages, pool_bytes, CudaError};
pub use matmul::{
    cublas_matmul, matmul_stats, matmul_strategies, MatmulStats, CUBLAS, CUBLAS_TF32, FAST,
};
pub use transfer::CudaTransfer;
pub use types::CudaBackend;

pub(crate) use copier::{bind_context, device_ptr_and_stream};
pub(crate) use kernels::plane_per_row;
pub(crate) use matmul::{kernel_names, select_matmul};
pub(crate) use types::{as_float, empty_like, float_cube, int_cube, is_float};
