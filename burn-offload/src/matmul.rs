//! Choosing the matmul kernel of `Gemm<B>` (process-wide: backend ops are
//! static functions, with no instance to hold the choice).

use crate::backend::MatmulError;

/// Chooses the matmul kernel of every `Gemm<B>` in the process: `auto` (burn's
/// own choice) or, with the `cuda` feature, one of [`matmul_names`].
pub fn set_matmul(name: &str) -> Result<(), MatmulError> {
    #[cfg(feature = "cuda")]
    return crate::cuda::select_matmul((name != "auto").then_some(name));
    #[cfg(not(feature = "cuda"))]
    match name {
        "auto" => Ok(()),
        _ => Err(MatmulError::NeedsCuda(name.to_string())),
    }
}

/// The kernel programs choose unless told otherwise: `fast` in CUDA builds
/// (the fastest measured kernel per dtype; in f32 the same tf32 staging as
/// burn's own matmul), `auto` elsewhere, where only burn's matmul exists.
pub const DEFAULT_MATMUL: &str = if cfg!(feature = "cuda") {
    "fast"
} else {
    "auto"
};

/// The matmul kernels [`set_matmul`] accepts.
pub fn matmul_names() -> Vec<String> {
    #[cfg(feature = "cuda")]
    return crate::cuda::kernel_names();
    #[cfg(not(feature = "cuda"))]
    vec!["auto".to_string()]
}
