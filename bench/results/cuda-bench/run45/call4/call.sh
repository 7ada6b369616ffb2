#!/usr/bin/env bash
# run45 call 4 (nvidia-h200), issue 53: LoRA on the Llama-3.1-8B shape, one
# 4,096-token sequence a step, rank 16 on every projection, the base held in
# bf16 (the page-locked slab path) and in NF4 (codes uploaded per weight and
# dequantised on the GPU) side by side, to place call 3's slow NF4 steps.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin; xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
for base in bf16 nf4; do
  BIG_SEQ=4096 BIG_STEPS=3 BIG_LIMIT=110 BIG_ROWS="l8b:4:auto" \
    ARGS="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --base-dtype $base" \
    bash bench/gpu/big.sh > /dev/null 2>&1
  mv $OUT/big-logs.tgz $OUT/big-logs-$base.tgz
  tail -1 /tmp/big-work/*.jsonl > $OUT/last-$base.json
done
cat $OUT/big.txt
