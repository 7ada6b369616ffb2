//! Checks made before touching a device, so a missing driver is a one-line
//! error naming the library instead of a panic deep inside the runtime.

/// Tries to load each shared library; the error names the first that fails.
pub fn check_libraries(names: &[&str]) -> Result<(), String> {
    for name in names {
        // SAFETY: loading a system library runs its initialisers; these are
        // the vendor's driver libraries the CUDA backend loads anyway.
        if let Err(err) = unsafe { libloading::Library::new(name) } {
            return Err(format!(
                "cannot load `{name}` ({err}); this is a --features cuda build: it needs an NVIDIA GPU with its driver installed"
            ));
        }
    }
    Ok(())
}

/// The CUDA driver library the CUDA backend needs at run time.
pub fn cuda_driver() -> Result<(), String> {
    check_libraries(&["libcuda.so.1"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_named_in_the_error() {
        let err =
            check_libraries(&["libc.so.6", "libburn-offload-no-such-driver.so.1"]).unwrap_err();
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
            Err(err) => assert!(err.contains("libcuda.so.1"), "{err}"),
        }
    }
}
