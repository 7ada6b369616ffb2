#!/usr/bin/env bash
# run49 call 3 (nvidia-h200), issue 55: (1) the block-recompute tests on CUDA
# (tests/tests/block_recompute.rs against plain burn on burn's CUDA backend,
# TOL 1e-3); (2) the Llama-2-7B shape, all 32 layers, fp32, 16k tokens a step
# through the type parameter with per-block recompute, as call 2's 16-layer
# row (parameter cache 4 GiB); the planner's host estimate (121.97 GiB, with
# the OS's headroom) is over this machine's 121.65 GiB available by 0.3 GiB,
# so the row passes --host-mem-gib 123.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin .device/x
xz -dc .device/train49/train.xz > .device/bin/train; chmod +x .device/bin/train
xz -dc .device/test49/block_recompute-tests.xz > .device/x/block_recompute-tests; chmod +x .device/x/block_recompute-tests
. bench/gpu/cublas_env.sh > /dev/null
timeout 200 .device/x/block_recompute-tests --test-threads 1 > $OUT/tests.txt 2>&1; echo "rc $?" >> $OUT/tests.txt
grep -E "^test |test result|panicked|rc " $OUT/tests.txt
ARGS="--param-cache-gib 4 --host-mem-gib 123" TP_ROWS="7b:16:host" TP_STEPS=6 TP_LIMIT=330 bash bench/gpu/typeparam.sh
