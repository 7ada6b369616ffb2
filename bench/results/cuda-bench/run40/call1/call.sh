#!/usr/bin/env bash
# run40 call 1 (nvidia-h100-x1), issue 50: the recompute takes the attention
# outputs of as many blocks as fit the GPU (EngineConfig::kept_attention, a
# count placed by the planner; before it, all or none, and at 262,144 tokens
# none fit). 0.85B, bf16, batch 1, one 262,144-token sequence a step: this
# tree's train against MegaTrain's engine in one call, 3 steps each; first
# the CUDA engine tests of the gradients with the outputs kept.
# Binaries in .device/att (bench/gpu/attention_binaries.sh).
set -u
mkdir -p .device/x /tmp/logs
for b in train engine-tests; do xz -dc .device/att/$b.xz > .device/x/$b; chmod +x .device/x/$b; done
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
. bench/gpu/cublas_env.sh > /dev/null
timeout 120 .device/x/engine-tests gradients --test-threads 1 > /tmp/logs/engine-tests.log 2>&1
echo "engine tests: exit $? $(grep 'test result' /tmp/logs/engine-tests.log)" | tee -a $S
s=262144
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/085b-$s.json
.device/x/train --model /tmp/085b-$s.json --seq-len $s --batch 1 --compute bf16 --plan > /tmp/logs/plan-$s.txt 2>&1
grep -iE 'attention|graphs|GPU' /tmp/logs/plan-$s.txt | tee -a $S
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-ours-$s.txt &
smi=$!
/usr/bin/time -v timeout 200 .device/x/train --model /tmp/085b-$s.json --steps 3 --warmup 1 --lr 1e-4 --seq-len $s --batch 1 \
  --compute bf16 --sample-tokens 0 --metrics /tmp/logs/ours-$s.jsonl > /tmp/logs/ours-$s.log 2>&1
echo "ours $s: exit $? $(grep -E 'Maximum resident' /tmp/logs/ours-$s.log) GPU peak MiB $(sort -n /tmp/logs/gpu-ours-$s.txt | tail -1)" | tee -a $S
kill $smi
grep -E '^step|take their attention|keep their|^attention' /tmp/logs/ours-$s.log | tee -a $S
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-megatrain-$s.txt &
smi=$!
timeout 250 python3 bench/peers/megatrain_llama.py --config /tmp/085b-$s.json --batch 1 --seq-len $s --steps 3 \
  --warmup-steps 1 --lr 3e-4 --dtype bf16 2> /tmp/logs/megatrain-$s.err | tail -1 | tee -a $S
echo "megatrain GPU peak MiB $(sort -n /tmp/logs/gpu-megatrain-$s.txt | tail -1)" | tee -a $S
kill $smi
grep -E '^step' /tmp/logs/megatrain-$s.err | tee -a $S
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
