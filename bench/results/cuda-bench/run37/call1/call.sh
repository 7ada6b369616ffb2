#!/usr/bin/env bash
# run37 call 1 (nvidia-h100-x1): the fused FlashAttention kernels (issue 37).
# (The CUDA kernel tests were still building: they ran in call 2.)
# 2. attention alone, one sequence, 32 query heads over 8 key/value heads,
#    bf16 (and f32 at 4k): the fused kernels and the tiled path
#    (attention_bench --lengths), and PyTorch's sdpa with the flash backend
#    (bench/peers/torch_sdpa.py), head widths 64 and 128.
# 3. A/B of train, 0.85B, bf16, one sequence of 16,384 tokens a step, two
#    interleaved rounds: this build (ab-flash) against main (ab-procs, fb345a2,
#    whose attention is the tiled path).
# 4. The peer: PyTorch resident training with per-block checkpointing and
#    sdpa, 0.85B, bf16, batch 1, at 16k and at 64k (its longest, run36).
set -u
. bench/gpu/cublas_env.sh > /dev/null
mkdir -p .device/x
for f in attention_bench; do xz -dc .device/fa/$f.xz > .device/x/$f; chmod +x .device/x/$f; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 .device/x/attention_bench --lengths 1024,4096,16384,65536 --dtype bf16 --reps 5 2>&1 | tee $OUT/attention.jsonl
timeout 90 .device/x/attention_bench --lengths 16384 --dtype bf16 --head-dim 128 --reps 5 2>&1 | tee -a $OUT/attention.jsonl
timeout 60 .device/x/attention_bench --lengths 4096 --dtype f32 --reps 5 2>&1 | tee -a $OUT/attention.jsonl
python3 bench/peers/torch_sdpa.py --lengths 1024,4096,16384,65536 --backend flash | tee $OUT/sdpa.jsonl
python3 bench/peers/torch_sdpa.py --lengths 16384 --head-dim 128 --backend flash | tee -a $OUT/sdpa.jsonl
AB_SEQ=16384 AB_TOKENS=1 AB_COMPUTE=bf16 AB_SYSTEMS=pipelined AB_BUILDS="flash procs" AB_ROUNDS=2 AB_STEPS=6 bash bench/gpu/ab.sh > /dev/null 2>&1
cat $OUT/ab.txt
for s in 16384 65536; do
  echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/llama-0.85b-$s.json
  timeout 150 python3 bench/peers/torch_llama.py --config /tmp/llama-0.85b-$s.json --mode resident-ckpt --dtype bf16 \
    --batch 1 --seq-len $s --steps 4 --warmup-steps 2 2>&1 | tail -1 | tee -a $OUT/torch-long.jsonl
done
