#!/usr/bin/env bash
# run38 call 8 (nvidia-h100-x1, call 6's loan): the Llama-3.2-1B shape at
# 262,144 tokens, step 3 of 3, resumed from call 7's checkpoint.
set -u
OUT=${OUT:-/tmp/out}
ls /tmp/ck1b
rm -rf .device/bin && tar xJf .device/long2.tar.xz -C .device
BIG_SEQ=262144 BIG_STEPS=3 BIG_LIMIT=450 BIG_ROWS="l1b:256:auto" ARGS="--resume /tmp/ck1b" bash bench/gpu/big.sh
cat $OUT/big.txt
