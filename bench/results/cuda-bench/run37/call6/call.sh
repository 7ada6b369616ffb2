#!/usr/bin/env bash
# run37 call 6 (nvidia-h100-x1): the backward kernel with one tile of shared
# memory less (the values pass through the output gradient's tile: 74 KB a
# cube at width 64, three cubes an SM instead of two), and an experimental
# routing that runs the fused backward at every length for heads of 64
# (ab-flash6), against call 4's build (ab-flash4: the fused backward up to
# 2048 positions) and main (ab-procs, fb345a2):
# 1. tests/tests/kernels.rs on CUDA with this build's kernels;
# 2. attention alone (attention_bench --lengths: fused, models, tiles), bf16;
# 3. A/B of train, 0.85B, bf16, one 16,384-token sequence a step, two
#    interleaved rounds of the three builds.
set -u
. bench/gpu/cublas_env.sh > /dev/null
mkdir -p .device/x
for f in kernels-tests attention_bench; do xz -dc .device/fa/$f.xz > .device/x/$f; chmod +x .device/x/$f; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 240 .device/x/kernels-tests --test-threads 1 --nocapture attention > $OUT/kernels.txt 2>&1; echo "rc $?" >> $OUT/kernels.txt
grep -E "^test |result|rc |off by|panicked" $OUT/kernels.txt
timeout 200 .device/x/attention_bench --lengths 1024,4096,16384,65536 --dtype bf16 --reps 5 2>&1 | tee $OUT/attention.jsonl
timeout 90 .device/x/attention_bench --lengths 16384 --dtype bf16 --head-dim 128 --reps 5 2>&1 | tee -a $OUT/attention.jsonl
AB_SEQ=16384 AB_TOKENS=1 AB_COMPUTE=bf16 AB_SYSTEMS=pipelined AB_BUILDS="flash6 flash4 procs" AB_ROUNDS=2 AB_STEPS=6 bash bench/gpu/ab.sh > /dev/null 2>&1
cat $OUT/ab.txt
