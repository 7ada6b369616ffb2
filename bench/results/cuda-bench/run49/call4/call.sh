#!/usr/bin/env bash
# run49 call 4 (nvidia-h200), issue 55, with this tree's train (.device/train49b:
# --block-recompute auto|on|off for --host-params, auto = off where the whole
# graph fits the GPU):
# (1) 0.85B Llama, fp32, 4k and 16k tokens a step (sequences of 1024), 6 steps,
#     median of steps 3-6: plain burn resident, the type parameter as the plan
#     places it (auto), and the type parameter with every block recomputed (on);
# (2) the Llama-2-7B shape, fp32, 16k tokens a step: the type parameter (auto:
#     recompute on, the whole graph does not fit) with a 4 GiB parameter cache
#     and --host-mem-gib 123 (call 3), then the engine on the same job (--fused).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin
xz -dc .device/train49b/train.xz > .device/bin/train; chmod +x .device/bin/train
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
TP_ROWS="085b:4:resident 085b:4:host 085b:16:resident 085b:16:host" TP_STEPS=6 TP_LIMIT=120 bash bench/gpu/typeparam.sh
mv $OUT/typeparam-logs.tgz $OUT/typeparam-logs-auto.tgz
echo "-- --block-recompute on" >> $OUT/typeparam.txt
ARGS="--block-recompute on" TP_ROWS="085b:4:host 085b:16:host" TP_STEPS=6 TP_LIMIT=120 bash bench/gpu/typeparam.sh
mv $OUT/typeparam-logs.tgz $OUT/typeparam-logs-on.tgz
echo "-- 7B, --param-cache-gib 4 --host-mem-gib 123" >> $OUT/typeparam.txt
ARGS="--param-cache-gib 4 --host-mem-gib 123" TP_ROWS="7b:16:host" TP_STEPS=6 TP_LIMIT=200 bash bench/gpu/typeparam.sh
mv $OUT/typeparam-logs.tgz $OUT/typeparam-logs-7b.tgz
TP_ROWS="7b:16:fused" TP_STEPS=6 TP_LIMIT=150 bash bench/gpu/typeparam.sh
