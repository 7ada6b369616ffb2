# nvidia-h200, kernels test binary at cbc0e24 (quant merged):
#   cargo test --release --features cuda -p burn-offload-tests --test kernels --no-run; strip; xz -> .device/q/kernels-tests.xz
# carry [".device/q/kernels-tests.xz"]
. bench/gpu/cublas_env.sh > /dev/null; xz -dc .device/q/kernels-tests.xz > /tmp/kt && chmod +x /tmp/kt && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader && /tmp/kt quantised_base --test-threads 1 --nocapture 2>&1 | tail -20
# then, same machine:
. bench/gpu/cublas_env.sh > /dev/null; timeout 150 /tmp/kt --test-threads 1 2>&1 | tail -25
