#!/usr/bin/env bash
# run36 call 8 (nvidia-h100-x1): issue 37's comparisons with PyTorch.
# 1. Attention alone, one sequence of 16k and 64k positions, 32 query heads
#    over 8 key/value heads, head width 64, bf16: burn-offload's attention
#    (.device/attn/attention_bench, build cd7305c + the --lengths mode) and
#    PyTorch's scaled_dot_product_attention with the flash backend
#    (bench/peers/torch_sdpa.py), forward and forward+backward.
# 2. PyTorch resident training of the 0.85B Llama with per-block
#    checkpointing and sdpa (bench/peers/torch_llama.py --mode resident-ckpt,
#    bf16 autocast), batch 1, at 16k, 32k and 64k tokens a sequence: where
#    does it stop fitting?
set -u
. bench/gpu/cublas_env.sh > /dev/null
mkdir -p .device/attn && xz -dc .device/attention_bench.xz > .device/attn/attention_bench && chmod +x .device/attn/attention_bench
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
.device/attn/attention_bench --lengths 16384,65536 --dtype bf16 --reps 5 | tee $OUT/attention.jsonl
python3 bench/peers/torch_sdpa.py --lengths 16384,65536 --backend flash | tee $OUT/sdpa.jsonl
for s in 16384 32768 65536; do
  echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/llama-0.85b-$s.json
  timeout 200 python3 bench/peers/torch_llama.py --config /tmp/llama-0.85b-$s.json --mode resident-ckpt --dtype bf16 \
    --batch 1 --seq-len $s --steps 4 --warmup-steps 2 2>&1 | tail -1 | tee -a $OUT/torch-long.jsonl
done
