#!/usr/bin/env bash
# run41 call 3 (nvidia-h100-x1, the machine call 2 left warm), issue 50: the
# 1B at 524,288 tokens resumes from call 2's checkpoint for step 3 of 3.
set -u
mkdir -p /tmp/logs
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
. bench/gpu/cublas_env.sh > /dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-1b-part2.txt &
smi=$!
/usr/bin/time -v timeout 560 .device/x/train --resume .device/ckpt-1b --model .device/llama1b.json --steps 3 --warmup 1 --lr 1e-4 --seq-len 524288 --batch 1 \
  --compute bf16 --data .device/corpus.txt --sample-tokens 0 --metrics .device/1b-524288.jsonl \
  --checkpoint-dir .device/ckpt-1b --checkpoint-every 2 > /tmp/logs/1b-524288-part2.log 2>&1
echo "ours 1B 524288 part 2: exit $? $(grep -E 'Maximum resident' /tmp/logs/1b-524288-part2.log) GPU peak MiB $(sort -n /tmp/logs/gpu-1b-part2.txt | tail -1)" | tee -a $S
kill $smi
cp .device/1b-524288.jsonl /tmp/logs/
grep -E '^step|take their attention|keep their|^attention|^memory plan|^host store|checkpoint|resum|error' /tmp/logs/1b-524288-part2.log | tee -a $S
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
