#!/usr/bin/env bash
# run33 call 11 (nvidia-h100-x1): A/B of the engine before this run's changes (d0b2229, .device/ab-before)
# and after them (0d54865's engine: the stem casting only its own weights, at most four blocks' gradients
# waiting for the host worker; .device/ab-after) on the 0.85B rows, two interleaved rounds each:
# fp32 at 16k tokens and bf16 at 64k.
mkdir -p $OUT/fp32 $OUT/bf16
OUT=$OUT/fp32 AB_BUILDS="after before" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_TOKENS=16 bash bench/gpu/ab.sh 2>&1 | grep -E "^pipelined" | cut -c1-200
OUT=$OUT/bf16 AB_BUILDS="after before" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_TOKENS=64 AB_COMPUTE=bf16 bash bench/gpu/ab.sh 2>&1 | grep -E "^pipelined" | cut -c1-200
