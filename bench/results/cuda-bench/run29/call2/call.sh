#!/usr/bin/env bash
# run29 call 2: the CUDA kernels test binary nine times, after its cross-entropy
# test drew seeded logits and bounded errors relative to the largest magnitude.
# Built with: cargo test --release --features cuda -p burn-offload-tests --test kernels --no-run
# (stripped, xz-compressed into .device/kernels/kernels-tests.xz and carried).
cd .device/kernels && xz -d -k kernels-tests.xz && chmod +x kernels-tests && cd ../.. && . bench/gpu/cublas_env.sh >/dev/null
for i in 1 2 3 4 5 6 7 8 9; do
  .device/kernels/kernels-tests --test-threads 1 --nocapture > /tmp/k$i.txt 2>&1
  echo "run $i: $(grep 'test result' /tmp/k$i.txt)"
  grep -E "F32: loss|BF16: loss" /tmp/k$i.txt; grep -E "panicked|FAILED" /tmp/k$i.txt
done 2>&1 | tee $OUT/kernels9.txt; cp /tmp/k1.txt $OUT/kernels-run1.txt
