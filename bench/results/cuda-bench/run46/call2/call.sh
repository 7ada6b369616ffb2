#!/usr/bin/env bash
# run46 call 2 (nvidia-h200), issue 53, after call 1 found the int8/NF4
# bases dequantised by burn's tensor operations (the CubeCL kernels were
# skipped under autodiff): the kernel tests (including the new check under
# autodiff) and the engine's LoRA tests on CUDA, then the Llama-3.1-8B shape
# (random init) at one 4,096-token sequence a step, side by side: LoRA r16 on
# every projection with the base in bf16, int8 and NF4, and the full
# fine-tune of the same shape in the two modes that fit the 125 GiB host
# (call 1: the plan's default needs 130 GiB): 8-bit Adam state (compact
# layout, 8 B/param) and --fused (fp32 state, 12 B/param). Binaries in .device/lora.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x .device/bin
for f in .device/lora/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
cp .device/x/train .device/bin/train
. bench/gpu/cublas_env.sh > /dev/null
timeout 60 .device/x/kernels-tests --test-threads 1 quantised 2>&1 | tail -5 > $OUT/tests.txt
timeout 90 .device/x/engine_lora-tests --test-threads 1 2>&1 | tail -8 >> $OUT/tests.txt
LORA="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
for base in bf16 int8 nf4 full; do
  echo "== $base" >> $OUT/big.txt
  rows="l8b:4:auto"; args="$LORA --base-dtype $base"
  [ $base = full ] && rows="l8b:4:compact-8bit l8b:4:fused-compact" && args=
  BIG_SEQ=4096 BIG_STEPS=5 BIG_LIMIT=100 BIG_ROWS="$rows" ARGS="$args" bash bench/gpu/big.sh > /dev/null 2>&1
  mv $OUT/big-logs.tgz $OUT/big-logs-$base.tgz
done
tar czf $OUT/logs.tgz -C $OUT big-logs-bf16.tgz big-logs-int8.tgz big-logs-nf4.tgz big-logs-full.tgz && rm $OUT/big-logs-*.tgz
cat $OUT/tests.txt $OUT/big.txt
