#!/usr/bin/env bash
# run32 call 7 (nvidia-h100-x1, train at a7b7231 as .device/train9.tar.xz): 7B at 64k tokens,
# the compact layout with fp32 and with 8-bit Adam state, side by side.
tar xJf .device/train9.tar.xz -C .device; OUT=$OUT HOST_GIB=125 BIG_STEPS=5 BIG_LIMIT=250 BIG_ROWS="7b:64:compact 7b:64:compact-8bit" bash bench/gpu/big.sh 2>&1 | tail -8
