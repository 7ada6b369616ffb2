#!/usr/bin/env bash
# run32 call 1 (nvidia-h100-x1, train at 18a6cd6): issue 36's 7B rows, bf16 compute, 64k tokens a step,
# clipping at 1.0 and the guard on; full (refused), compact (one backward), fused (two backwards).
OUT=$OUT HOST_GIB=125 BIG_STEPS=5 BIG_LIMIT=250 BIG_ROWS="7b:64:full 7b:64:compact 7b:64:fused" bash bench/gpu/big.sh
