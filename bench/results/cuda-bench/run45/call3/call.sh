#!/usr/bin/env bash
# run45 call 3 (nvidia-h200), issue 50 and 53:
# 1. The CubeCL attention kernels' CUDA tests with 16-byte vector loads and
#    register-prefetched double buffering (branch att-kernel, .device/att2).
# 2. attention_bench fused (the CubeCL mma kernels), bf16, causal, d64 32/8
#    heads, 16k and 64k: main (.device/lora), vector loads only (.device/att2a),
#    both changes (.device/att2), side by side.
# 3. LoRA on the Llama-3.1-8B shape, NF4 base, rank 16 on every projection,
#    one 4,096-token sequence a step (big.sh), to see the store build and steps.
set -u
OUT=${OUT:-/tmp/out}
for d in lora att2 att2a; do
  mkdir -p .device/x-$d
  for f in .device/$d/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x-$d/$b; chmod +x .device/x-$d/$b; done
done
. bench/gpu/cublas_env.sh > /dev/null
timeout 120 .device/x-att2/kernels-tests --test-threads 1 attention 2>&1 | tail -25 > $OUT/kernels.txt
for d in lora att2a att2; do
  echo "== $d" >> $OUT/attention.jsonl
  timeout 60 .device/x-$d/attention_bench --lengths 16384,65536 --dtype bf16 --head-dim 64 --heads 32,8 --cases fused --reps 5 >> $OUT/attention.jsonl 2>&1
done
mkdir -p .device/bin; cp .device/x-lora/train .device/bin/train
BIG_SEQ=4096 BIG_STEPS=4 BIG_LIMIT=150 BIG_ROWS="l8b:4:auto" \
  ARGS="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --base-dtype nf4" \
  bash bench/gpu/big.sh > /dev/null 2>&1
cat $OUT/kernels.txt $OUT/attention.jsonl $OUT/big.txt
