#!/usr/bin/env bash
# run41 call 2 (nvidia-h100-x1), issue 50: the Llama-3.2-1B shape (random
# init) at 524,288 tokens, bf16, batch 1: steps 1-2 of 3, a checkpoint after
# step 2 (--stop-after 2), so call 3 on the same warm machine resumes for
# step 3. One step takes minutes, so the run spans two calls (10 min each).
set -u
mkdir -p .device/x /tmp/logs
xz -dc .device/new/train.xz > .device/x/train; chmod +x .device/x/train
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
. bench/gpu/cublas_env.sh > /dev/null
echo '{"arch":"llama","vocab_size":128256,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":8192,"rope_theta":500000.0,"tie_embeddings":true,"max_seq_len":524288}' > .device/llama1b.json
# The built-in corpus holds 400k tokens: a text file of 3 MB (bytes: one token each).
python3 -c "import random; r=random.Random(0); w=[''.join(r.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(r.randint(2,9))) for _ in range(5000)]; print(' '.join(r.choice(w) for _ in range(500000)))" > .device/corpus.txt
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-1b-part1.txt &
smi=$!
rm -rf .device/ckpt-1b
/usr/bin/time -v timeout 560 .device/x/train --model .device/llama1b.json --steps 3 --warmup 1 --lr 1e-4 --seq-len 524288 --batch 1 \
  --compute bf16 --data .device/corpus.txt --sample-tokens 0 --metrics .device/1b-524288.jsonl \
  --checkpoint-dir .device/ckpt-1b --checkpoint-every 2 --stop-after 2 > /tmp/logs/1b-524288-part1.log 2>&1
echo "ours 1B 524288 part 1: exit $? $(grep -E 'Maximum resident' /tmp/logs/1b-524288-part1.log) GPU peak MiB $(sort -n /tmp/logs/gpu-1b-part1.txt | tail -1)" | tee -a $S
kill $smi
cp .device/1b-524288.jsonl /tmp/logs/ 2>/dev/null
grep -E '^step|take their attention|keep their|^attention|^memory plan|^host store|checkpoint|stopp|error' /tmp/logs/1b-524288-part1.log | tee -a $S
ls -la .device/ckpt-1b | tee -a $S
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
