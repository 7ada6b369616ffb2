#!/usr/bin/env bash
# run50 call 5 (nvidia-h200), issue 54 items 2 and 5: the 7B row against
# MegaTrain's engine through the command a user with a GPU box runs,
# `cargo xtask bench cuda run`, here as the xtask binary built on the dev
# machine (.device/xtask50) with the train binary of call 4 (.device/train50)
# and --no-build: Llama-2-7B shape, bf16, 64 sequences of 1,024 tokens a
# step, the engine with the compact host layout (exact clipping) and
# MegaTrain (.device/megatrain, 919520f), one row each, report and plot.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p target/release .device/x
xz -dc .device/train50/train.xz > target/release/train; chmod +x target/release/train
xz -dc .device/xtask50/xtask.xz > .device/x/xtask; chmod +x .device/x/xtask
. bench/gpu/cublas_env.sh > /dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
LIMIT_ROW=420 BENCH_STEPS=5 .device/x/xtask bench cuda run --no-build --shape 7b --tokens 64 \
  --systems compact,megatrain --precision bf16 --out $OUT/report --font .device/font/DejaVuSans.ttf 2>&1 | tail -40
cp $OUT/report/bench.md $OUT/bench.md 2>/dev/null; cp $OUT/report/bench.png $OUT/bench.png 2>/dev/null
cd $OUT && tar czf report.tgz report && rm -rf report
