#!/usr/bin/env bash
# run35 call 5 (nvidia-h100-x1, the build of call 4): the Llama-3.2-3B shape
# at 65,536 tokens a sequence, bf16, batch 1, 3 steps: on a 24 GiB GPU
# budget, where the plan runs the MLP over tiles of 8192 tokens, and on the
# whole GPU, where it runs plain.
set -u
OUT=${OUT:-/tmp/out}
rm -rf .device/bin && tar xJf .device/mlp.tar.xz -C .device
BIG_SEQ=65536 BIG_STEPS=3 BIG_LIMIT=200 ARGS="--gpu-mem-gib 24" BIG_ROWS="l3b:64:auto" bash bench/gpu/big.sh
mv $OUT/big.txt $OUT/big-24g.txt; mv $OUT/big-logs.tgz $OUT/big-logs-24g.tgz
BIG_SEQ=65536 BIG_STEPS=3 BIG_LIMIT=200 BIG_ROWS="l3b:64:auto" bash bench/gpu/big.sh
