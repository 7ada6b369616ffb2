#!/usr/bin/env bash
# run49 call 2 (nvidia-h200), issue 55: the Llama-2-7B shape in fp32 at 16k
# tokens a step (16 sequences of 1024) through the type parameter with
# per-block recompute (`train --resident --host-params`, parameter cache
# 4 GiB), 32 layers and 16 (the same width: GPU peak against depth), then the
# engine on the same job (`--fused`, 12 B/param, what fits the host), 6 steps,
# median of steps 3-6. This tree's train (.device/train49).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin
xz -dc .device/train49/train.xz > .device/bin/train; chmod +x .device/bin/train
free -g | tee $OUT/host.txt
ARGS="--param-cache-gib 4" TP_ROWS="7b16:16:host 7b:16:host" TP_STEPS=6 TP_LIMIT=250 bash bench/gpu/typeparam.sh
mv $OUT/typeparam-logs.tgz $OUT/typeparam-logs-host.tgz
TP_ROWS="7b:16:fused" TP_STEPS=6 TP_LIMIT=200 bash bench/gpu/typeparam.sh
