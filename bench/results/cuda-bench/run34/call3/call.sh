#!/usr/bin/env bash
# run34 call 3 (nvidia-h100-x2, issue 39): CUPTI timelines of the 0.85B in
# bf16 at 64k tokens per GPU on 1 and 2 GPUs (where 2 GPUs scaled 0.63), to
# see what the one driving thread waits in during the backward.
rm -rf .device/bin; mkdir -p .device; tar xJf .device/dp.tar.xz -C .device
TL_SYSTEMS=pipelined TL_TOKENS=64 TL_COMPUTE=bf16 TL_STEPS=5 bash bench/gpu/timeline/run.sh 2>&1 | tail -25
TAG=x2 ARGS="--gpus 2" TL_SYSTEMS=pipelined TL_TOKENS=64 TL_COMPUTE=bf16 TL_STEPS=5 bash bench/gpu/timeline/run.sh 2>&1 | tail -25
cp /tmp/timeline-work/*.trace.xz $OUT/ 2>/dev/null; ls -la $OUT
