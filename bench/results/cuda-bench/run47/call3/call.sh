#!/usr/bin/env bash
# run47 call 3 (nvidia-h200), issue 53: call 1's NF4 row and call 2's int8
# row of the Llama-3.1-70B shape (LoRA r16 on every projection,
# --gpu-mem-gib 24, 4,096 tokens a step, 5 steps) with the pools' ceiling at
# the budget less 2 GiB (call 2's int8 row peaked at 25.3 GiB by nvidia-smi
# with the pools at 23.2 GiB under a 23 GiB ceiling), each with the phase
# trace in its log (pages past the budget).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin; xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
LORA="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --gpu-mem-gib 24"
for base in nf4 int8; do
  echo "== $base" >> $OUT/big.txt
  BURN_OFFLOAD_TRACE=1 BIG_SEQ=4096 BIG_STEPS=5 BIG_LIMIT=280 BIG_ROWS="l70b:4:auto" ARGS="$LORA --base-dtype $base" \
    bash bench/gpu/big.sh > /dev/null 2>&1
  tail -1 /tmp/big-work/*.jsonl > $OUT/last-step-$base.json
  grep -o "[0-9]* pages past the budget" /tmp/big-work/*.err | sort | uniq -c > $OUT/past-$base.txt
  grep "reserved" /tmp/big-work/*.err | grep -o "[0-9.]* GiB reserved" | sort -n | tail -1 >> $OUT/past-$base.txt
done
cat $OUT/big.txt $OUT/past-*.txt
