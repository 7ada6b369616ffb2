#!/usr/bin/env bash
# run47 call 5 (nvidia-h200), issue 53: call 4's int8 row again (the
# Llama-3.1-70B shape, LoRA r16 on every projection, --gpu-mem-gib 24, 4,096
# tokens a step, 5 steps), a stream at the pools' ceiling now also taking
# back the other streams' free pages (call 4's row passed the ceiling by
# 1-4 pages a step and peaked at 24,593 MiB). call 4's NF4 row never passed
# the ceiling, so this change does not touch it.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin; xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
LORA="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --gpu-mem-gib 24"
BURN_OFFLOAD_TRACE=1 BIG_SEQ=4096 BIG_STEPS=5 BIG_LIMIT=250 BIG_ROWS="l70b:4:auto" ARGS="$LORA --base-dtype int8" \
  bash bench/gpu/big.sh > /dev/null 2>&1
tail -1 /tmp/big-work/*.jsonl > $OUT/last-step-int8.json; cp /tmp/big-work/*.plan $OUT/plan-int8.txt
grep -o "[0-9]* pages past the budget" /tmp/big-work/*.err | sort | uniq -c > $OUT/past-int8.txt
grep "reserved" /tmp/big-work/*.err | grep -o "[0-9.]* GiB reserved" | sort -n | tail -1 >> $OUT/past-int8.txt
echo "gpu_peak_mib $(sort -n /tmp/big-work/*.gpu | tail -1)" >> $OUT/big.txt
cat $OUT/big.txt $OUT/past-int8.txt
