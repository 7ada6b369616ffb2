#!/usr/bin/env bash
# run32 call 5 (nvidia-h100-x1, same build): the 8-bit largest model again with no kept graphs.
tar xJf .device/train8.tar.xz -C .device; OUT=$OUT/largest8 HOST_GIB=125 BIG_STEPS=6 BIG_LIMIT=400 ARGS="--lr 5e-6 --warmup 2 --keep-graphs 0" BIG_ROWS="w8-84:4:fused-compact-8bit" bash bench/gpu/big.sh 2>&1 | tail -4
