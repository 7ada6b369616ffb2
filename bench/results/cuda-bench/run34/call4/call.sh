#!/usr/bin/env bash
# run34 call 4 (nvidia-h100-x2, one GPU for the A/B; issue 38 acceptance 2):
# A/B of one GPU's rows, the engine before the data-parallel lanes
# (.device/ab-main: the build of 5835d0f's engine, run33's "after") and after
# (.device/ab-dp), two interleaved rounds each: 0.85B fp32 at 16k tokens and
# bf16 at 64k. Then (issue 39) the bf16 64k row with burn's own matmul
# (`--matmul auto`, no cuBLAS) on 1 and 2 GPUs, against the cuBLAS rows of
# call 1, whose 2-GPU backward ran at one GPU's pace.
mkdir -p $OUT/fp32 $OUT/bf16
OUT=$OUT/fp32 AB_BUILDS="dp main" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_TOKENS=16 bash bench/gpu/ab.sh 2>&1 | grep -E "^pipelined" | cut -c1-200
OUT=$OUT/bf16 AB_BUILDS="dp main" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_TOKENS=64 AB_COMPUTE=bf16 bash bench/gpu/ab.sh 2>&1 | grep -E "^pipelined" | cut -c1-200
rm -rf .device/bin; mkdir -p .device; tar xJf .device/dp.tar.xz -C .device
SHAPES=085b BENCH_TOKENS=64 SYSTEMS=pipelined-bf16 GPUS="1 2" MATMUL=auto RESULTS=auto bash bench/gpu/pipeline.sh bench 2>&1 | grep -E "^==|^exit|tok_s_median" | cut -c1-250
