#!/usr/bin/env bash
# run28 call 2: GPU parity of the fused RMSNorm/rotary build (norm); lookup vs norm A/B; trace of lookup.
set -u
O=$OUT
OUT=$O/parity bash bench/gpu/pipeline.sh parity 2>&1 | tail -60
OUT=$O/ab AB_BUILDS="lookup norm" AB_COMPUTE=bf16 AB_TOKENS=64 AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_LIMIT=90 bash bench/gpu/ab.sh
. bench/gpu/cublas_env.sh
BURN_OFFLOAD_TRACE=1 timeout 90 .device/ab-lookup/train --model /tmp/llama-0.85b.json --steps 5 --warmup 1 --lr 3e-4 \
  --seq-len 1024 --batch 64 --compute bf16 --sample-tokens 0 --metrics $O/trace-lookup.jsonl > $O/trace-lookup.log 2> $O/trace-lookup.err
echo "trace exit $?"
