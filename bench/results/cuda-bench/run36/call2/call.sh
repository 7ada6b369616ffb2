#!/usr/bin/env bash
# run36 call 2 (nvidia-h100-x2, the machine of call 1): the 0.85B bf16 row at
# 64k tokens per GPU on 1 GPU, 2 lanes of one process and 2 processes.
set -u
rm -rf .device/bin; mkdir -p .device/bin; tar xJf .device/ab-procs.tar.xz -C .device
GPUS="1 2" PROCESSES=2 SHAPES=085b BENCH_TOKENS=64 SYSTEMS=pipelined-bf16 RESULTS=gpus-bf16 bash bench/gpu/pipeline.sh bench 2>&1 | grep -E "^==|^exit|tok_s_median" | cut -c1-300
