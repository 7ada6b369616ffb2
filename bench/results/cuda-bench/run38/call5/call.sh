#!/usr/bin/env bash
# run38 call 5 (nvidia-h100-x1, the loan of call 4): the 0.85B at 262,144
# tokens a sequence, step 3 of 3, resumed from call 4's checkpoint
# (/tmp/ck085/step-00000002 on the same machine).
set -u
OUT=${OUT:-/tmp/out}
ls /tmp/ck085
rm -rf .device/bin && tar xJf .device/long2.tar.xz -C .device
BIG_SEQ=262144 BIG_STEPS=3 BIG_LIMIT=560 BIG_ROWS="085b:256:auto" ARGS="--resume /tmp/ck085" bash bench/gpu/big.sh
cat $OUT/big.txt
