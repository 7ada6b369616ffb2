#!/usr/bin/env bash
# run34 call 6 (nvidia-h100-x2, issue 39): the Llama-2-7B shape, bf16, 64k
# tokens per GPU, compact host layout, on 1 and 2 GPUs, with call 5's build.
rm -rf .device/bin; mkdir -p .device; tar xJf .device/dp2.tar.xz -C .device
HOST_GIB=250 RESULTS=gpus7b bash bench/gpu/pipeline.sh bench-gpus-7b 2>&1 | grep -E "^==|^exit|tok_s_median|Maximum resident" | cut -c1-300
