#!/usr/bin/env bash
# run45 call 2 (nvidia-h200), issue 53: LoRA on the Llama-3.1-70B shape
# (random init) with its base frozen in host memory in NF4, rank 16 on every
# projection, bf16 compute, one 4,096-token sequence a step, the GPU held to
# 24 GiB (--gpu-mem-gib 24, a 24 GB card's budget). Binary: train of .device/lora.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin
xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
BIG_SEQ=4096 BIG_STEPS=4 BIG_LIMIT=540 BIG_ROWS="l70b:4:auto" \
  ARGS="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --base-dtype nf4 --gpu-mem-gib 24" \
  bash bench/gpu/big.sh
cat $OUT/big.txt
