#!/usr/bin/env bash
# run42 call 2 (nvidia-h100-x1), issue 50: the engine's gradients against
# plain burn on CUDA with block inputs split between the host and the GPU
# (EngineConfig::device_checkpoints 1 and 2 beside 0 and all), the test
# binary of tests/tests/engine_gradients.rs built at 13ce13d:
#   cargo test --release --features cuda -p burn-offload-tests --test engine_gradients --no-run
set -u
xz -dc .device/eg/engine_gradients.xz > /tmp/engine_gradients && chmod +x /tmp/engine_gradients
. bench/gpu/cublas_env.sh > /dev/null
timeout 200 /tmp/engine_gradients --test-threads 1 2>&1 | tail -15 | tee $OUT/summary.txt
