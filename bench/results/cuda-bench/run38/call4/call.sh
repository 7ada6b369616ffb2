#!/usr/bin/env bash
# run38 call 4 (nvidia-h100-x1): the 0.85B at 262,144 tokens a sequence,
# batch 1, bf16, with call 3's build (the mma.sync kernels), steps 1-2 of 3:
# a step takes ~4 minutes, so the three steps span two calls of one loan.
# This call stops after two steps and checkpoints (--stop-after 2); call 5
# resumes from that checkpoint (kept in the machine's /tmp between the
# calls) and trains the third.
set -u
OUT=${OUT:-/tmp/out}
rm -rf .device/bin && tar xJf .device/long2.tar.xz -C .device
rm -rf /tmp/ck085
BIG_SEQ=262144 BIG_STEPS=3 BIG_LIMIT=570 BIG_ROWS="085b:256:auto" ARGS="--stop-after 2 --checkpoint-dir /tmp/ck085" bash bench/gpu/big.sh
cat $OUT/big.txt
ls -la /tmp/ck085 /tmp/ck085/* | head
df -h /tmp | tail -1
