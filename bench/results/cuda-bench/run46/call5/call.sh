#!/usr/bin/env bash
# run46 call 5 (nvidia-h200), issue 53: call 3's 70B NF4 LoRA row reserved
# 26.5 GiB of pools (27.9 GiB in nvidia-smi) under --gpu-mem-gib 24; its
# largest phase is the LM head's 4,096-token chunk of 128k-vocabulary
# logits (2.1 GB buffers). The same row with --loss-chunk-tokens 1024.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin
xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
LORA="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --gpu-mem-gib 24"
BIG_SEQ=4096 BIG_STEPS=5 BIG_LIMIT=330 BIG_ROWS="l70b:4:auto" ARGS="$LORA --base-dtype nf4 --loss-chunk-tokens 1024" \
  bash bench/gpu/big.sh > /dev/null 2>&1
tail -1 /tmp/big-work/*.jsonl > $OUT/last-step.json
cp /tmp/big-work/*.plan $OUT/plan.txt
cat $OUT/big.txt
