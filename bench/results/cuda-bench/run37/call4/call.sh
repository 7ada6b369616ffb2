#!/usr/bin/env bash
# run37 call 4 (nvidia-h100-x1): the fused kernels with the backward in one
# kernel (FlashAttention-2's five products a tile, dq summed with atomic adds)
# and the operands a plane reuses read from shared memory once; attention
# routed as the models run it (the "models" rows: past FUSED_BACKWARD_UP_TO,
# 2048 positions, the fused forward and the tiled backward):
# (The CUDA kernel tests of this build were still building: call 5.)
# 2. attention alone (attention_bench --lengths: fused, models, tiles) and
#    PyTorch's sdpa with the flash backend, one sequence, 32 query heads over
#    8 key/value heads, bf16, head widths 64 and 128 (and f32 at 4k);
# 3. A/B of train, 0.85B, bf16, one 16,384-token sequence a step, two
#    interleaved rounds: this build (ab-flash4) against main (ab-procs,
#    fb345a2: the tiled path);
# 4. the peer: PyTorch resident training with per-block checkpointing and
#    sdpa, 0.85B, bf16, batch 1, at 64k (its longest, run36).
set -u
. bench/gpu/cublas_env.sh > /dev/null
mkdir -p .device/x
for f in attention_bench; do xz -dc .device/fa/$f.xz > .device/x/$f; chmod +x .device/x/$f; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 240 .device/x/attention_bench --lengths 1024,2048,4096,16384,65536 --dtype bf16 --reps 5 2>&1 | tee $OUT/attention.jsonl
timeout 90 .device/x/attention_bench --lengths 1024,16384 --dtype bf16 --head-dim 128 --reps 5 2>&1 | tee -a $OUT/attention.jsonl
timeout 60 .device/x/attention_bench --lengths 4096 --dtype f32 --reps 5 2>&1 | tee -a $OUT/attention.jsonl
python3 bench/peers/torch_sdpa.py --lengths 1024,2048,4096,16384,65536 --backend flash | tee $OUT/sdpa.jsonl
python3 bench/peers/torch_sdpa.py --lengths 1024,16384 --head-dim 128 --backend flash | tee -a $OUT/sdpa.jsonl
AB_SEQ=16384 AB_TOKENS=1 AB_COMPUTE=bf16 AB_SYSTEMS=pipelined AB_BUILDS="flash4 procs" AB_ROUNDS=2 AB_STEPS=6 bash bench/gpu/ab.sh > /dev/null 2>&1
cat $OUT/ab.txt
s=65536
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/llama-0.85b-$s.json
timeout 150 python3 bench/peers/torch_llama.py --config /tmp/llama-0.85b-$s.json --mode resident-ckpt --dtype bf16 \
  --batch 1 --seq-len $s --steps 4 --warmup-steps 2 2>&1 | tail -1 | tee -a $OUT/torch-long.jsonl
