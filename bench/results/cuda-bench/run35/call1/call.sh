#!/usr/bin/env bash
# run35 call 1 (nvidia-h100-x1; train and the kernels test binary built at the
# tiled-attention commit, as .device/long.tar.xz; main's train as ab-dp2):
# the attention kernels on CUDA (key tiles included), the A/B at one 16k
# sequence (0.85B bf16), and the 0.85B at 64k tokens per sequence.
set -u
OUT=${OUT:-/tmp/out}
rm -rf .device/bin && tar xJf .device/long.tar.xz -C .device
. bench/gpu/cublas_env.sh >/dev/null
.device/bin/kernels-tests --test-threads 1 --nocapture > $OUT/kernels.txt 2>&1; echo "kernels exit $?" | tee -a $OUT/kernels.txt
tail -3 $OUT/kernels.txt
cp .device/long.tar.xz .device/ab-tile.tar.xz
AB_BUILDS="tile dp2" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_SEQ=16384 AB_TOKENS=1 AB_COMPUTE=bf16 AB_STEPS=6 AB_LIMIT=120 bash bench/gpu/ab.sh
BIG_SEQ=65536 BIG_STEPS=4 BIG_LIMIT=240 BIG_ROWS="085b:64:auto" bash bench/gpu/big.sh
cd $OUT && tar czf call1.tgz --exclude call1.tgz . && ls
