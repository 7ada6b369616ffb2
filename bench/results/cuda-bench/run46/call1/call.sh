#!/usr/bin/env bash
# run46 call 1 (nvidia-h200), issue 53: the engine's LoRA tests on CUDA with
# the quantised codes in a page-locked slab, then the Llama-3.1-8B shape
# (random init) at one 4,096-token sequence a step, side by side: LoRA r16
# on every projection with the base held in bf16, int8 and NF4, and the full
# fine-tune of the same shape (plan auto). Binaries in .device/lora.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x .device/bin
for f in .device/lora/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
cp .device/x/train .device/bin/train
. bench/gpu/cublas_env.sh > /dev/null
timeout 120 .device/x/engine_lora-tests --test-threads 1 2>&1 | tail -8 > $OUT/engine_lora.txt
LORA="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
for base in bf16 int8 nf4 full; do
  args="$LORA --base-dtype $base"; [ $base = full ] && args=
  echo "== $base" >> $OUT/big.txt
  BIG_SEQ=4096 BIG_STEPS=5 BIG_LIMIT=110 BIG_ROWS="l8b:4:auto" ARGS="$args" \
    bash bench/gpu/big.sh > /dev/null 2>&1
  mv $OUT/big-logs.tgz $OUT/big-logs-$base.tgz
done
tar czf $OUT/logs.tgz -C $OUT big-logs-bf16.tgz big-logs-int8.tgz big-logs-nf4.tgz big-logs-full.tgz && rm $OUT/big-logs-*.tgz
cat $OUT/engine_lora.txt $OUT/big.txt
