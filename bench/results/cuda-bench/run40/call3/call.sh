#!/usr/bin/env bash
# run40 call 3 (nvidia-h100-x1), issue 50: the Llama-3.2-1B shape (random
# init) at 524,288 tokens, bf16, batch 1, 3 steps (the first a warmup), with
# a checkpoint after step 2 so a next call could resume. Same binary as call 2.
set -u
mkdir -p .device/x /tmp/logs
xz -dc .device/r40/train.xz > .device/x/train; chmod +x .device/x/train
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
. bench/gpu/cublas_env.sh > /dev/null
echo '{"arch":"llama","vocab_size":128256,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":8192,"rope_theta":500000.0,"tie_embeddings":true,"max_seq_len":524288}' > /tmp/llama1b.json
# The built-in corpus holds 400k tokens: a text file of 3 MB (bytes: one token each).
python3 -c "import random; r=random.Random(0); w=[''.join(r.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(r.randint(2,9))) for _ in range(5000)]; print(' '.join(r.choice(w) for _ in range(500000)))" > /tmp/corpus.txt
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-1b.txt &
smi=$!
/usr/bin/time -v timeout 570 .device/x/train --model /tmp/llama1b.json --steps 3 --warmup 1 --lr 1e-4 --seq-len 524288 --batch 1 \
  --compute bf16 --data /tmp/corpus.txt --sample-tokens 0 --metrics /tmp/logs/1b-524288.jsonl --checkpoint-dir .device/ckpt-1b --checkpoint-every 2 > /tmp/logs/1b-524288.log 2>&1
echo "ours 1B 524288: exit $? $(grep -E 'Maximum resident' /tmp/logs/1b-524288.log) GPU peak MiB $(sort -n /tmp/logs/gpu-1b.txt | tail -1)" | tee -a $S
kill $smi
grep -E '^step|take their attention|keep their|^attention|^memory plan|^host store|checkpoint' /tmp/logs/1b-524288.log | tee -a $S
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
