#!/usr/bin/env bash
# run28 call 4: the device timeline of f864941 (bf16, 64k tokens).
set -u
O=$OUT
OUT=$O/tl TL_SYSTEMS=pipelined TL_COMPUTE=bf16 TL_TOKENS=64 TAG=bf16 TL_STEPS=5 TL_LIMIT=100 bash bench/gpu/timeline/run.sh | grep -v "^ " | head -20
