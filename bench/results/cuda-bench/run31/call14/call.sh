# Device call (ran on an NVIDIA H200), carry .device/tptests.tar.xz: the CUDA test binaries at ac169b1,
# cargo test --release --features cuda -p burn-offload-tests --test host_optim --test offload_backend --no-run
. bench/gpu/cublas_env.sh
for i in 1 2 3; do for t in host_optim offload_backend; do /tmp/tpt/$t-tests --test-threads 1; done; done
