#!/usr/bin/env bash
# run49 call 1 (nvidia-h200), issue 55: the type parameter with per-block
# recompute (Autodiff<Offload<Gemm<Cuda>>> + the host AdamW, `train --resident
# --host-params`, each block a checkpoint) against plain burn resident
# (Autodiff<Gemm<Cuda>> + burn's AdamW, whole graph on the GPU), 0.85B Llama,
# fp32, 4k and 16k tokens a step (sequences of 1024), 6 steps, median of
# steps 3-6; the 4k pair twice. This tree's train (.device/train49).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin
xz -dc .device/train49/train.xz > .device/bin/train; chmod +x .device/bin/train
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
TP_ROWS="085b:4:resident 085b:4:host 085b:16:resident 085b:16:host 085b:4:resident 085b:4:host" \
  TP_STEPS=6 TP_LIMIT=120 bash bench/gpu/typeparam.sh
