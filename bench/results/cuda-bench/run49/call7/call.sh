#!/usr/bin/env bash
# run49 call 7 (nvidia-h200), issue 55: the custom-loop example (a plain burn
# loop: forward, cross-entropy, backward, GradientsParams, optimizer step) on
# Autodiff<Offload<Gemm<Cuda>>> with the host AdamW, every block recomputed
# (the library's default), Llama-2-7B's shape in fp32, 16 rows of 1024 tokens
# a step (16k), 6 steps: all 32 layers, then 16 (the same width), GPU memory
# sampled by nvidia-smi every 200 ms. This tree's custom-loop (.device/loop49).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
xz -dc .device/loop49/custom-loop.xz > .device/x/custom-loop; chmod +x .device/x/custom-loop
. bench/gpu/cublas_env.sh > /dev/null
for layers in 32 16; do
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > /tmp/gpu-$layers.txt &
  smi=$!
  /usr/bin/time -v timeout 250 .device/x/custom-loop --shape llama7b --layers $layers --batch 16 --seq 1024 \
    --steps 6 --lr 1e-5 > $OUT/loop-$layers.txt 2> /tmp/loop-$layers.err
  echo "exit $?" >> $OUT/loop-$layers.txt
  kill $smi; wait $smi 2>/dev/null
  echo "gpu_peak_mib $(sort -n /tmp/gpu-$layers.txt | tail -1)" >> $OUT/loop-$layers.txt
  grep -E "Maximum resident|Elapsed" /tmp/loop-$layers.err >> $OUT/loop-$layers.txt
  tail -3 /tmp/loop-$layers.err >> $OUT/loop-$layers.txt
  cat $OUT/loop-$layers.txt
done
