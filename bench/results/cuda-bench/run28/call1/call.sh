#!/usr/bin/env bash
# run28 call 1: fused RMSNorm + rotary (norm) against the session's base build.
set -u
O=$OUT
OUT=$O/ab AB_BUILDS="norm base" AB_COMPUTE=bf16 AB_TOKENS=64 AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_LIMIT=90 bash bench/gpu/ab.sh
. bench/gpu/cublas_env.sh
BURN_OFFLOAD_TRACE=1 timeout 90 .device/ab-norm/train --model /tmp/llama-0.85b.json --steps 5 --warmup 1 --lr 3e-4 \
  --seq-len 1024 --batch 64 --compute bf16 --sample-tokens 0 --metrics $O/trace-norm.jsonl > $O/trace-norm.log 2> $O/trace-norm.err
echo "trace exit $?"
OUT=$O/tl TL_SYSTEMS=pipelined TL_COMPUTE=bf16 TL_TOKENS=64 TAG=bf16 TL_STEPS=5 TL_LIMIT=100 bash bench/gpu/timeline/run.sh
ls -R $O | head -30
