#!/usr/bin/env bash
# run46 call 3 (nvidia-h200), issue 53: LoRA r16 on every projection of the
# Llama-3.1-70B shape (random init), bf16 compute, one 4,096-token sequence
# a step, the GPU held to a 24 GB card's budget (--gpu-mem-gib 24), the base
# frozen in host memory in NF4, then in int8. Binaries in .device/lora.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin
xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
LORA="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --gpu-mem-gib 24"
for base in nf4 int8; do
  echo "== $base" >> $OUT/big.txt
  BIG_SEQ=4096 BIG_STEPS=5 BIG_LIMIT=$([ $base = nf4 ] && echo 320 || echo 200) BIG_ROWS="l70b:4:auto" ARGS="$LORA --base-dtype $base" \
    bash bench/gpu/big.sh > /dev/null 2>&1
  mv $OUT/big-logs.tgz $OUT/big-logs-$base.tgz
  cp /tmp/big-work/*.plan $OUT/plan-$base.txt
done
cat $OUT/big.txt
