#!/usr/bin/env bash
# run34 call 1 (nvidia-h100-x2, issues 38 and 39): the data-parallel parity
# tests on both GPUs (NCCL), a smoke run of `train --gpus 2`, then the
# 0.85B rows on 1 and 2 GPUs (fp32 16k and bf16 64k tokens per GPU).
nvidia-smi topo -m > $OUT/topo.txt 2>&1; cat $OUT/topo.txt
rm -rf .device/bin; mkdir -p .device; tar xJf .device/dp.tar.xz -C .device
RESULTS=parity bash bench/gpu/pipeline.sh parity-dp 2>&1 | tail -12
. bench/gpu/cublas_env.sh
timeout 120 .device/bin/train --model llama-tiny --steps 4 --warmup 1 --batch 2 --seq-len 64 --gpus 2 --sample-tokens 0 > $OUT/smoke.txt 2>&1; echo "smoke exit $?"; tail -5 $OUT/smoke.txt
RESULTS=gpus bash bench/gpu/pipeline.sh bench-gpus-085b 2>&1 | grep -E "^==|^exit|tok_s_median" | cut -c1-300
