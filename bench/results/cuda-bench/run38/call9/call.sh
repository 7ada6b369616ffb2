#!/usr/bin/env bash
# run38 call 9 (nvidia-h100-x1): in one call, the A/B of train at one 16,384-
# token sequence (0.85B, bf16; call 3's build fast2 against main, procs,
# fb345a2; two interleaved rounds), the attention kernels beside sdpa (flash)
# at 16k, and the peer: PyTorch resident training with per-block
# checkpointing and sdpa, 0.85B, bf16, batch 1, at 64k (its longest, run36).
set -u
. bench/gpu/cublas_env.sh > /dev/null
mkdir -p .device/x
xz -dc .device/fa3/attention_bench.xz > .device/x/attention_bench; chmod +x .device/x/attention_bench
timeout 60 .device/x/attention_bench --lengths 16384 --dtype bf16 --reps 5 > $OUT/attention.jsonl 2>&1
python3 bench/peers/torch_sdpa.py --lengths 16384 --backend flash > $OUT/sdpa.jsonl 2>&1
cat $OUT/attention.jsonl $OUT/sdpa.jsonl
AB_SEQ=16384 AB_TOKENS=1 AB_COMPUTE=bf16 AB_SYSTEMS=pipelined AB_BUILDS="fast2 procs" AB_ROUNDS=2 AB_STEPS=6 bash bench/gpu/ab.sh > /dev/null 2>&1
cat $OUT/ab.txt
s=65536
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/llama-0.85b-$s.json
timeout 150 python3 bench/peers/torch_llama.py --config /tmp/llama-0.85b-$s.json --mode resident-ckpt --dtype bf16 \
  --batch 1 --seq-len $s --steps 4 --warmup-steps 2 2>&1 | tail -1 | tee $OUT/torch-long.jsonl
