#!/usr/bin/env bash
# run35 call 3 (nvidia-h100-x1, the build of call 1): the Llama-3.2-3B shape
# at 131,072 tokens per sequence, bf16, fp32 Adam state, batch 1, 3 steps.
set -u
OUT=${OUT:-/tmp/out}
rm -rf .device/bin && tar xJf .device/long.tar.xz -C .device
BIG_SEQ=131072 BIG_STEPS=3 BIG_LIMIT=570 BIG_ROWS="l3b:128:auto" bash bench/gpu/big.sh
