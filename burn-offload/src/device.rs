//! The copy machinery of this build, and `Offload<B>` over it: CUDA's in
//! CUDA builds (which does what the host's does on any other backend), the
//! host's otherwise. The one place the build's choice is made.

/// The copy machinery the engine's pager and `Offload<B>` drive.
#[cfg(feature = "cuda")]
pub type DeviceTransfer = crate::cuda::CudaTransfer;
/// The copy machinery the engine's pager and `Offload<B>` drive.
#[cfg(not(feature = "cuda"))]
pub type DeviceTransfer = crate::transfer::HostTransfer;

/// `Offload<B>`: a burn backend decorator whose parameters live in host
/// memory and are paged in when an operation reads them (`Llama<Offload<Cuda>>`).
pub type Offload<B> = crate::backend::OffloadWith<B, DeviceTransfer>;
