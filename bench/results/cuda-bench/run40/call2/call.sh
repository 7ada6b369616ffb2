#!/usr/bin/env bash
# run40 call 2 (nvidia-h100-x1), issue 50: 2d83984, the attention outputs
# kept for as many recomputed blocks as fit, the plan running the MLP in
# tiles or keeping block inputs in host memory where that keeps more.
# 0.85B, bf16, batch 1, one 262,144-token sequence a step: this tree's
# train against MegaTrain's engine in one call, 3 steps each. Then the
# plans (nothing run) of the Llama-3.2-1B shape at 524,288 tokens and the
# Llama-3.1-8B shape at 262,144 with 8-bit Adam state.
# The train binary (cargo build --release --features cuda -p trainer --bin train, stripped) in .device/r40.
set -u
mkdir -p .device/x /tmp/logs
xz -dc .device/r40/train.xz > .device/x/train; chmod +x .device/x/train
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
. bench/gpu/cublas_env.sh > /dev/null
s=262144
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/085b-$s.json
.device/x/train --model /tmp/085b-$s.json --seq-len $s --batch 1 --compute bf16 --plan > /tmp/logs/plan-085b-$s.txt 2>&1
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-ours-$s.txt &
smi=$!
/usr/bin/time -v timeout 200 .device/x/train --model /tmp/085b-$s.json --steps 3 --warmup 1 --lr 1e-4 --seq-len $s --batch 1 \
  --compute bf16 --sample-tokens 0 --metrics /tmp/logs/ours-$s.jsonl > /tmp/logs/ours-$s.log 2>&1
echo "ours $s: exit $? $(grep -E 'Maximum resident' /tmp/logs/ours-$s.log) GPU peak MiB $(sort -n /tmp/logs/gpu-ours-$s.txt | tail -1)" | tee -a $S
kill $smi
grep -E '^step|take their attention|keep their|^attention|^memory plan' /tmp/logs/ours-$s.log | tee -a $S
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-megatrain-$s.txt &
smi=$!
timeout 300 python3 bench/peers/megatrain_llama.py --config /tmp/085b-$s.json --batch 1 --seq-len $s --steps 3 \
  --warmup-steps 1 --lr 3e-4 --dtype bf16 > /tmp/logs/megatrain-$s.out 2> /tmp/logs/megatrain-$s.err
echo "megatrain $s: exit $? GPU peak MiB $(sort -n /tmp/logs/gpu-megatrain-$s.txt | tail -1)" | tee -a $S
kill $smi
tail -2 /tmp/logs/megatrain-$s.out | tee -a $S
grep -E '^step' /tmp/logs/megatrain-$s.err | tee -a $S
echo '{"arch":"llama","vocab_size":128256,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":8192,"rope_theta":500000.0,"tie_embeddings":true,"max_seq_len":524288}' > /tmp/llama1b.json
echo '{"arch":"llama","vocab_size":128256,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":8,"d_ff":14336,"rope_theta":500000.0,"max_seq_len":262144}' > /tmp/llama8b.json
.device/x/train --model /tmp/llama1b.json --seq-len 524288 --batch 1 --compute bf16 --plan > /tmp/logs/plan-1b-524288.txt 2>&1
echo "plan 1B 524288: exit $? $(tail -3 /tmp/logs/plan-1b-524288.txt | tr '\n' ' ')" | tee -a $S
.device/x/train --model /tmp/llama8b.json --seq-len 262144 --batch 1 --compute bf16 --optim-state 8bit --plan > /tmp/logs/plan-8b-262144.txt 2>&1
echo "plan 8B 262144: exit $? $(tail -3 /tmp/logs/plan-8b-262144.txt | tr '\n' ' ')" | tee -a $S
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
