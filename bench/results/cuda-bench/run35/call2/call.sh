#!/usr/bin/env bash
# run35 call 2 (nvidia-h100-x1, the build of call 1): the Llama-3.1-8B shape
# at 65,536 tokens per sequence, bf16, 8-bit Adam state (the fp32 state's
# compact layout needs 127.8 GiB of the 125), batch 1, 4 steps.
set -u
OUT=${OUT:-/tmp/out}
rm -rf .device/bin && tar xJf .device/long.tar.xz -C .device
BIG_SEQ=65536 BIG_STEPS=4 BIG_LIMIT=540 BIG_ROWS="l8b:64:auto-8bit" bash bench/gpu/big.sh
