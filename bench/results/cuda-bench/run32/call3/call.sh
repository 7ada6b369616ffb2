#!/usr/bin/env bash
# run32 call 3 (nvidia-h100-x1, same build): --gpu-mem-gib 24 (16k tokens) and 10 (4k tokens) on the
# 7B compact rows; the largest model again at a learning rate it trains at (5e-6, warm-up 2).
for g in 24:16 10:4; do IFS=: read gib tok <<< "$g"; mkdir -p $OUT/gpu$gib; tar xJf .device/bin.tar.xz -C .device; .device/bin/train --plan --model /dev/null 2>/dev/null; OUT=$OUT/gpu$gib HOST_GIB=125 BIG_STEPS=6 BIG_LIMIT=150 ARGS="--gpu-mem-gib $gib" BIG_ROWS="7b:$tok:compact" bash bench/gpu/big.sh 2>&1 | tail -4; cat /tmp/big-work/7b-${tok}k-compact.plan | tail -14; done; OUT=$OUT/largest HOST_GIB=125 BIG_STEPS=6 BIG_LIMIT=200 ARGS="--lr 5e-6 --warmup 2" BIG_ROWS="w8-42:4:fused-compact" bash bench/gpu/big.sh 2>&1 | tail -4
