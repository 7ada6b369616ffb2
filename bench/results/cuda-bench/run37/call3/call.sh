#!/usr/bin/env bash
# run37 call 3 (nvidia-h100-x1): the fused kernels with branch-free tile
# loads (a load inside an `if` made the compiler wait out each load's latency
# in turn), side by side with the tiled path, PyTorch's sdpa and main:
# 1. attention alone (attention_bench --lengths, both paths) and sdpa flash,
#    one sequence, 32 query heads over 8 key/value heads, bf16, head widths
#    64 and 128 (and f32 at 4k);
# 2. A/B of train, 0.85B, bf16, one 16,384-token sequence a step, two
#    interleaved rounds: this build (ab-flash2) against main (ab-procs,
#    fb345a2: the tiled path);
# 3. the peer: PyTorch resident training with per-block checkpointing and
#    sdpa, 0.85B, bf16, batch 1, at 16k and 64k (its longest, run36).
set -u
. bench/gpu/cublas_env.sh > /dev/null
mkdir -p .device/x
xz -dc .device/fa/attention_bench.xz > .device/x/attention_bench; chmod +x .device/x/attention_bench
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 .device/x/attention_bench --lengths 1024,4096,16384,65536 --dtype bf16 --reps 5 2>&1 | tee $OUT/attention.jsonl
timeout 90 .device/x/attention_bench --lengths 1024,16384 --dtype bf16 --head-dim 128 --reps 5 2>&1 | tee -a $OUT/attention.jsonl
timeout 60 .device/x/attention_bench --lengths 4096 --dtype f32 --reps 5 2>&1 | tee -a $OUT/attention.jsonl
python3 bench/peers/torch_sdpa.py --lengths 1024,4096,16384,65536 --backend flash | tee $OUT/sdpa.jsonl
python3 bench/peers/torch_sdpa.py --lengths 1024,16384 --head-dim 128 --backend flash | tee -a $OUT/sdpa.jsonl
AB_SEQ=16384 AB_TOKENS=1 AB_COMPUTE=bf16 AB_SYSTEMS=pipelined AB_BUILDS="flash2 procs" AB_ROUNDS=2 AB_STEPS=6 bash bench/gpu/ab.sh > /dev/null 2>&1
cat $OUT/ab.txt
for s in 16384 65536; do
  echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/llama-0.85b-$s.json
  timeout 150 python3 bench/peers/torch_llama.py --config /tmp/llama-0.85b-$s.json --mode resident-ckpt --dtype bf16 \
    --batch 1 --seq-len $s --steps 4 --warmup-steps 2 2>&1 | tail -1 | tee -a $OUT/torch-long.jsonl
done
