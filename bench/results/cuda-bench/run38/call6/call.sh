#!/usr/bin/env bash
# run38 call 6 (nvidia-h100-x1, a fresh loan): the kernels test on CUDA with
# the windowed comparison's windows 2, 37, 64, 100 (call 3 stopped at window 1,
# whose dq and dk are rounding noise); then the Llama-3.2-1B shape at 262,144
# tokens a sequence, batch 1, bf16, call 3's build, step 1 of 3 (one step a
# call: calls 7 and 8 resume from the checkpoint in /tmp/ck1b).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
xz -dc .device/fa4/kernels-tests.xz > .device/x/kernels-tests; chmod +x .device/x/kernels-tests
timeout 150 .device/x/kernels-tests --test-threads 1 --nocapture windowed > $OUT/kernels.txt 2>&1; echo "rc $?" >> $OUT/kernels.txt
grep -E "^test |result|rc |panicked|window" $OUT/kernels.txt
rm -rf .device/bin && tar xJf .device/long2.tar.xz -C .device
rm -rf /tmp/ck1b
BIG_SEQ=262144 BIG_STEPS=3 BIG_LIMIT=420 BIG_ROWS="l1b:256:auto" ARGS="--stop-after 1 --checkpoint-dir /tmp/ck1b" bash bench/gpu/big.sh
cat $OUT/big.txt
