#!/usr/bin/env bash
# run50 call 4 (nvidia-h200), issue 54 item 2 on the kind lent (its target
# names nvidia-h100-x1, not lent): Llama-2-7B shape, bf16, 64k tokens a step
# (64 sequences of 1,024), exact clipping (the default --grad-clip 1.0),
# --host-layout compact; this tree's train (.device/train50, 2a461dc + the
# attention change) against MegaTrain's engine (.device/megatrain,
# 919520f, driven by bench/peers/megatrain_llama.py) in one call.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x /tmp/logs
xz -dc .device/train50/train.xz > .device/x/train; chmod +x .device/x/train
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
free -g | head -2 | tee -a $S
. bench/gpu/cublas_env.sh > /dev/null
echo '{"arch":"llama","vocab_size":32000,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":32,"d_ff":11008,"max_seq_len":1024}' > /tmp/7b.json
.device/x/train --model /tmp/7b.json --seq-len 1024 --batch 64 --compute bf16 --host-layout compact --plan > /tmp/logs/plan-7b.txt 2>&1
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-ours.txt &
smi=$!
/usr/bin/time -v timeout 240 .device/x/train --model /tmp/7b.json --steps 6 --warmup 2 --lr 1e-5 --seq-len 1024 --batch 64 \
  --compute bf16 --host-layout compact --sample-tokens 0 --metrics /tmp/logs/ours.jsonl > /tmp/logs/ours.log 2>&1
echo "ours: exit $? $(grep -E 'Maximum resident' /tmp/logs/ours.log) GPU peak MiB $(sort -n /tmp/logs/gpu-ours.txt | tail -1)" | tee -a $S
kill $smi
grep -E 'host store ready|keep their|^attention' /tmp/logs/ours.log | tee -a $S
python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; r=[x for x in r if 'tokens_per_s' in x][2:]; print('ours median tok/s', round(statistics.median(x['tokens_per_s'] for x in r)), 'model TFLOPS', round(statistics.median(x['model_tflops'] for x in r),1), 'hardware TFLOPS', round(statistics.median(x['hardware_tflops'] for x in r),1), 'losses', [round(x['loss'],4) for x in r])" /tmp/logs/ours.jsonl | tee -a $S
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-megatrain.txt &
smi=$!
/usr/bin/time -v timeout 300 python3 bench/peers/megatrain_llama.py --config /tmp/7b.json --batch 64 --seq-len 1024 --steps 5 \
  --warmup-steps 2 --lr 1e-5 --dtype bf16 > /tmp/logs/megatrain.out 2> /tmp/logs/megatrain.err
echo "megatrain: exit $? $(grep -E 'Maximum resident' /tmp/logs/megatrain.err) GPU peak MiB $(sort -n /tmp/logs/gpu-megatrain.txt | tail -1)" | tee -a $S
kill $smi
tail -2 /tmp/logs/megatrain.out | cut -c1-600 | tee -a $S
grep -E '^step' /tmp/logs/megatrain.err | tee -a $S
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
