#!/usr/bin/env bash
# run45 call 1 (nvidia-h200), issue 53: the engine's LoRA tests on CUDA
# (frozen f32/bf16/int8/NF4 base against plain burn, CubeCL dequantisation
# streamed), then bench/gpu/lora_fidelity.sh (ours against a PyTorch + PEFT
# LoRA loop with the same recipe and batches; our PEFT export read by PEFT).
# Binaries: train, engine_lora tests (release, cuda) in .device/lora.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
for f in .device/lora/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
. bench/gpu/cublas_env.sh > /dev/null
timeout 150 .device/x/engine_lora-tests --test-threads 1 2>&1 | tail -15 | tee $OUT/engine_lora.txt
TRAIN=.device/x/train OUT=$OUT timeout 420 bash bench/gpu/lora_fidelity.sh > $OUT/fidelity.log 2>&1
echo "fidelity exit $?"; cat $OUT/summary.txt
