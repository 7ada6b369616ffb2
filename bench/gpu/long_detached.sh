#!/usr/bin/env bash
# A long-sequence training run that outlasts one 10-minute device call, kept
# alive between calls instead of checkpointed: `start` launches train in a
# session of its own (setsid: the device tool leaves such a process running
# while the machine is held) and follows it for WAIT_S seconds; `follow`
# follows it again. Issue each `follow` at once: the machine goes back after
# 30 s idle, and the run with it. Nothing is written to disk but logs (an 8B
# checkpoint is most of the machine's disk, and writing and reading one costs
# a minute of device time).
#
#   LONG_MODEL=8b LONG_SEQ=262144 LONG_STEPS=3 \
#     LONG_FLAGS="--optim-state 8bit --fused --grad-clip 0" bash bench/gpu/long_detached.sh start
#   bash bench/gpu/long_detached.sh follow
#
# The model, corpus and binary are bench/gpu/long_setup.sh's, the flags
# long_parts.sh's. Writes $OUT/summary.txt
# (the plan, each step's line, peaks once done) and $OUT/results.tgz.
set -u
mode=${1:?start or follow}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/logs
S=$OUT/summary.txt
if [ "$mode" = start ]; then
  . bench/gpu/long_setup.sh
  args="--model .device/long-model.json --steps ${LONG_STEPS:-3} --warmup 1 --lr 1e-4 --seq-len $seq --batch 1 --compute bf16 --data .device/long-corpus.txt --sample-tokens 0 --metrics /tmp/logs/long.jsonl ${LONG_FLAGS:-}"
  .device/x/train $args --plan > /tmp/logs/plan.txt 2>&1; tail -25 /tmp/logs/plan.txt | tee -a $S
  cat > /tmp/logs/run.sh <<RUN
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu.txt &
/usr/bin/time -v .device/x/train $args > /tmp/logs/train.log 2>&1
echo \$? > /tmp/logs/exit
kill %1
RUN
  setsid bash /tmp/logs/run.sh < /dev/null > /dev/null 2>&1 &
fi
deadline=$((SECONDS + ${WAIT_S:-570}))
while [ ! -f /tmp/logs/exit ] && [ $SECONDS -lt $deadline ]; do sleep 5; done
grep -E '^step|take their attention|on the device|^attention|^memory plan|^host store|error' /tmp/logs/train.log | tee -a $S
if [ -f /tmp/logs/exit ]; then
  echo "exit $(cat /tmp/logs/exit) $(grep -E 'Maximum resident' /tmp/logs/train.log) GPU peak MiB $(sort -n /tmp/logs/gpu.txt | tail -1)" | tee -a $S
else
  echo "still running after ${SECONDS} s: follow at once" | tee -a $S
fi
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
