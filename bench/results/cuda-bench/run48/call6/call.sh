#!/usr/bin/env bash
# run48 call 6 (nvidia-h200), issue 50: the review's tree (the forward's row
# layout named once, one launch geometry a path): the CUDA kernel tests of
# the fused and windowed attention in bf16 and f32.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
xz -dc .device/att48d/kernels-tests.xz > .device/x/kernels-tests; chmod +x .device/x/kernels-tests
. bench/gpu/cublas_env.sh > /dev/null
for t in fused_attention_matches_the_reference_in_bf16 windowed_attention_matches_the_reference_in_bf16 windowed_attention_matches_the_reference_in_f32; do
  timeout 150 .device/x/kernels-tests --test-threads 1 --exact $t >> $OUT/kernels.txt 2>&1; echo "rc $? $t" >> $OUT/kernels.txt
done
grep -E "^test |result|rc |panicked" $OUT/kernels.txt
