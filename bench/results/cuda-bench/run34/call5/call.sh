#!/usr/bin/env bash
# run34 call 5 (nvidia-h100-x2): the build with the vendored cubecl-cuda drop
# queue that does not wait on the server thread (.device/dp2, .device/ab-dp2).
# Issue 38 acceptance 2: A/B of one GPU's rows against the engine before the
# lanes (.device/ab-main), two interleaved rounds: 0.85B fp32 16k, bf16 64k.
# Issue 39: the 0.85B rows on 1 and 2 GPUs again.
mkdir -p $OUT/fp32 $OUT/bf16
OUT=$OUT/fp32 AB_BUILDS="dp2 main" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_TOKENS=16 bash bench/gpu/ab.sh 2>&1 | grep -E "^pipelined" | cut -c1-200
OUT=$OUT/bf16 AB_BUILDS="dp2 main" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_TOKENS=64 AB_COMPUTE=bf16 bash bench/gpu/ab.sh 2>&1 | grep -E "^pipelined" | cut -c1-200
rm -rf .device/bin; mkdir -p .device; tar xJf .device/dp2.tar.xz -C .device
RESULTS=gpus bash bench/gpu/pipeline.sh bench-gpus-085b 2>&1 | grep -E "^==|^exit|tok_s_median" | cut -c1-250
