#!/usr/bin/env bash
# run34 call 7 (nvidia-h100-x4, issue 39, the final build): the data-parallel
# parity tests with their lanes on the GPUs (2 and 3 lanes, NCCL), then the
# 0.85B rows on 1, 2 and 4 GPUs and the Llama-2-7B row on 1 and 4.
rm -rf .device/bin; mkdir -p .device; tar xJf .device/dp3.tar.xz -C .device
nvidia-smi topo -m > $OUT/topo.txt 2>&1; head -6 $OUT/topo.txt
RESULTS=parity bash bench/gpu/pipeline.sh parity-dp 2>&1 | tail -8
GPUS="1 2 4" RESULTS=gpus bash bench/gpu/pipeline.sh bench-gpus-085b 2>&1 | grep -E "^==|^exit|tok_s_median" | cut -c1-250
GPUS="1 4" HOST_GIB=500 RESULTS=gpus7b bash bench/gpu/pipeline.sh bench-gpus-7b 2>&1 | grep -E "^==|^exit|tok_s_median" | cut -c1-250
