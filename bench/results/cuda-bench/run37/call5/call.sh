#!/usr/bin/env bash
# run37 call 5 (nvidia-h100-x1):
# 1. tests/tests/kernels.rs on CUDA, the kernels of call 4 (build 16:16: the
#    fused kernels against the reference, head widths 64 and 128, lengths not
#    multiples of the 64-row tile, grouped-query ratios 1, 4, 8, f32 and bf16;
#    the tiled path; causal_attention past FUSED_BACKWARD_UP_TO).
# 2. One step of the 0.85B at 262,144 tokens a sequence, batch 1, bf16, with
#    call 4's train (ab-flash4): how long a step takes, GPU and host peaks.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
xz -dc .device/fa/kernels-tests.xz > .device/x/kernels-tests; chmod +x .device/x/kernels-tests
timeout 240 .device/x/kernels-tests --test-threads 1 --nocapture attention > $OUT/kernels.txt 2>&1; echo "rc $?" >> $OUT/kernels.txt
grep -E "^test |result|rc |off by|panicked" $OUT/kernels.txt
cp .device/ab-flash4.tar.xz .device/bin.tar.xz
BIG_SEQ=262144 BIG_STEPS=1 BIG_LIMIT=420 BIG_ROWS="085b:256:auto" bash bench/gpu/big.sh
cat $OUT/big.txt
