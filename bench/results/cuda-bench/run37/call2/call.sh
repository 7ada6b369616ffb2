#!/usr/bin/env bash
# run37 call 2 (nvidia-h100-x1, the build of call 1):
# 1. tests/tests/kernels.rs on CUDA: the fused kernels against the reference
#    (head widths 64 and 128, lengths not multiples of the 64-row tile,
#    grouped-query ratios 1, 4, 8, f32 and bf16) and the tiled path.
# 2. The CUDA source cubecl generates for the fused kernels
#    (CUBECL_DEBUG_LOG), to see why they run at a tenth of sdpa.
set -u
mkdir -p .device/x
for f in kernels-tests attention_bench; do xz -dc .device/fa/$f.xz > .device/x/$f; chmod +x .device/x/$f; done
timeout 240 .device/x/kernels-tests --test-threads 1 --nocapture attention > $OUT/kernels.txt 2>&1; echo "rc $?" >> $OUT/kernels.txt
grep -E "^test |result|rc |error|off by" $OUT/kernels.txt
CUBECL_DEBUG_LOG=/tmp/cubecl.log timeout 60 .device/x/attention_bench --lengths 1024 --dtype bf16 --reps 1 > /dev/null 2>&1
grep -c . /tmp/cubecl.log; xz -c /tmp/cubecl.log > $OUT/cubecl.log.xz
