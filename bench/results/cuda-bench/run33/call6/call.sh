#!/usr/bin/env bash
# run33 call 6 (nvidia-h100-x1, train at 649a5dd as .device/train14.tar.xz): issue 36's GPU budget rows,
# a 7B (Llama-2-7B shape) in bf16 with the compact host layout, five steps, at --gpu-mem-gib 24
# (16k tokens a step) and 10 (4k), the whole-process GPU peak from nvidia-smi every 200 ms.
tar xJf .device/train14.tar.xz -C .device
for g in 24:16 10:4; do IFS=: read gib tok <<< "$g"; mkdir -p $OUT/gpu$gib; OUT=$OUT/gpu$gib HOST_GIB=125 BIG_STEPS=5 BIG_LIMIT=150 ARGS="--gpu-mem-gib $gib" BIG_ROWS="7b:$tok:compact" bash bench/gpu/big.sh 2>&1 | grep -E "^7b|error|plan" | cut -c1-400; done
