#!/usr/bin/env bash
# A long-sequence training run whose steps outlast one 10-minute device call,
# run in parts on one warm machine: part 1 trains LONG_FIRST steps and writes
# a checkpoint (--stop-after), each later part resumes it for the rest (or
# LONG_FIRST more). The checkpoint folder stays on the machine between calls
# only while it is warm (30 s idle): issue the next part at once.
#
#   LONG_MODEL=8b LONG_SEQ=262144 LONG_STEPS=3 LONG_FIRST=2 \
#     LONG_FLAGS="--optim-state 8bit --fused --grad-clip 0" bash bench/gpu/long_parts.sh 1
#   (same variables) bash bench/gpu/long_parts.sh 2
#
# LONG_MODEL: 1b (Llama-3.2-1B shape) or 8b (Llama-3.1-8B shape), random
# init, bf16, batch 1, on a text file of random words (bytes as tokens).
# The train binary: .device/new/train.xz (cargo build --release --features
# cuda -p trainer --bin train, stripped, xz). Writes $OUT/summary.txt (the
# plan, each step's line, peaks) and $OUT/results.tgz (logs, metrics).
set -u
part=${1:?part 1, 2, ...}
. bench/gpu/long_setup.sh
args=(--model .device/long-model.json --steps ${LONG_STEPS:-3} --warmup 1 --lr 1e-4 --seq-len $seq --batch 1
  --compute bf16 --data .device/long-corpus.txt --sample-tokens 0 --metrics .device/long.jsonl ${LONG_FLAGS:-})
if [ "$part" = 1 ]; then
  rm -rf .device/long-ckpt .device/long.jsonl
  .device/x/train "${args[@]}" --plan > /tmp/logs/plan.txt 2>&1; tail -25 /tmp/logs/plan.txt | tee -a $S
else
  args+=(--resume .device/long-ckpt)
fi
# A part that stops before the last step writes a checkpoint there (--stop-after);
# the last part writes none (no --checkpoint-dir), so the disk holds one at a
# time: the 8B's is ~48 GB of the machine's 64 GiB, which also means two parts.
stop=$(( part * ${LONG_FIRST:-${LONG_STEPS:-3}} ))
if [ $stop -lt ${LONG_STEPS:-3} ]; then
  args+=(--checkpoint-dir .device/long-ckpt --keep 1 --stop-after $stop)
fi
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-part$part.txt &
smi=$!
/usr/bin/time -v timeout ${LONG_LIMIT:-540} .device/x/train "${args[@]}" > /tmp/logs/part$part.log 2>&1
echo "part $part: exit $? $(grep -E 'Maximum resident' /tmp/logs/part$part.log) GPU peak MiB $(sort -n /tmp/logs/gpu-part$part.txt | tail -1)" | tee -a $S
kill $smi
cp .device/long.jsonl /tmp/logs/ 2>/dev/null
grep -E '^step|take their attention|on the device|^attention|^memory plan|^host store|checkpoint|resumed|error' /tmp/logs/part$part.log | tee -a $S
df -h . | tail -1 | tee -a $S
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
