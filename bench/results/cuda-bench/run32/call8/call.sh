#!/usr/bin/env bash
# run32 call 8 (nvidia-h100-x1, train at d0b2229 as .device/train10.tar.xz): the --gpu-mem-gib rows of
# call 3 again, with cubecl's pool pages held to an eighth of the budget.
tar xJf .device/train10.tar.xz -C .device; for g in 24:16 10:4; do IFS=: read gib tok <<< "$g"; mkdir -p $OUT/gpu$gib; OUT=$OUT/gpu$gib HOST_GIB=125 BIG_STEPS=5 BIG_LIMIT=150 ARGS="--gpu-mem-gib $gib" BIG_ROWS="7b:$tok:compact" bash bench/gpu/big.sh 2>&1 | grep -E "^7b|error" | cut -c1-400; done
