//! Checks made before touching a device, so a missing driver is a one-line
//! error naming the library instead of a panic deep inside the runtime.

/// A check made before touching a device that failed.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// A shared library the backend needs at run time did not load.
    #[error(
        "cannot load `{name}` ({source}); this is a --features cuda build: it needs an NVIDIA GPU with its driver installed"
    )]
    Library {
        /// The library's file name.
        name: String,
        /// What the loader said.
        source: libloading::Error,
    },
}

/// Tries to load each shared library; the error names the first that fails.
pub fn check_libraries(names: &[&str]) -> Result<(), PreflightError> {
    for name in names {
        // SAFETY: loading a system library runs its initialisers; these are
        // the vendor's driver libraries the CUDA backend loads anyway.
        if let Err(source) = unsafe { libloading::Library::new(name) } {
            return Err(PreflightError::Library {
                name: name.to_string(),
                source,
            });
        }
    }
    Ok(())
}

/// The CUDA driver library the CUDA backend needs at run time.
pub fn cuda_driver() -> Result<(), PreflightError> {
    check_libraries(&["libcuda.so.1"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_named_in_the_error() {
        let err = check_libraries(&["libc.so.6", "libburn-offload-no-such-driver.so.1"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot load `libburn-offload-no-such-driver.so.1`"),
            "{err}"
        );
        assert!(err.contains("NVIDIA GPU"), "{err}");
    }

    #[test]
    fn cuda_driver_check_matches_the_machine() {
        // CI machines have no GPU driver: the check must say which library is missing.
        let has_driver = std::path::Path::new("/proc/driver/nvidia").exists();
        match cuda_driver() {
            Ok(()) => assert!(has_driver, "libcuda loaded without an NVIDIA driver"),
            Err(err) => assert!(err.to_string().contains("libcuda.so.1"), "{err}"),
        }
    }
}
