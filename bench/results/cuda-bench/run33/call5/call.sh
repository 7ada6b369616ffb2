#!/usr/bin/env bash
# run33 call 5 (nvidia-h100-x1, train at 649a5dd as .device/train14.tar.xz): cargo xtask bench's 7B rows,
# Llama-2-7B shape, bf16 compute, 64k tokens a step, five steps: the compact host layout, the same
# with 8-bit Adam state, today's --fused (two backwards for exact clipping), and PyTorch FSDP2 with
# CPU offload and bf16 mixed precision (per-block checkpointing), in one call.
tar xJf .device/train14.tar.xz -C .device
TRAIN_BIN=.device/bin/train HOST_GIB=125 BENCH_STEPS=5 LIMIT_ROW=300 RESULTS=bench7b bash bench/gpu/pipeline.sh bench-7b
# dev machine:
# cargo xtask bench cuda report --results bench/results/cuda-bench/run33/call5 --out bench/results/cuda-bench/run33/report-call5
