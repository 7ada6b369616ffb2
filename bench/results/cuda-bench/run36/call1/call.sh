#!/usr/bin/env bash
# run36 call 1 (nvidia-h100-x2): issue 38, one process per GPU
# (`train --processes 2`, NCCL between processes; .device/ab-procs.tar.xz).
# 1. parity-processes: 2 processes against 2 lanes of one process and one GPU
#    on their micro-batches together, 20 steps with clipping, deferred and
#    fused (0.85B, 2k tokens per GPU).
# 2. The 0.85B fp32 row at 16k tokens per GPU on 1 GPU, 2 lanes, 2 processes.
set -u
rm -rf .device/bin; mkdir -p .device/bin; tar xJf .device/ab-procs.tar.xz -C .device
OUT0=$OUT
RESULTS=parity bash bench/gpu/pipeline.sh parity-processes 2>&1 | grep -v "^[0-9]* (" | cut -c1-250
GPUS="1 2" PROCESSES=2 SHAPES=085b BENCH_TOKENS=16 SYSTEMS=pipelined RESULTS=gpus-fp32 bash bench/gpu/pipeline.sh bench 2>&1 | grep -E "^==|^exit|tok_s_median" | cut -c1-300
