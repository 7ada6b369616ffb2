#!/usr/bin/env bash
# run46 call 6 (nvidia-h200), issue 53, diagnostic: where the device memory
# of calls 3 and 5 goes beyond the plan. The Llama-3.1-70B width with 8
# blocks (the same per-block buffers, a tenth of the store build), LoRA r16,
# NF4 base, --gpu-mem-gib 24, --loss-chunk-tokens 1024, 2 steps, with the
# phase trace (device pools in use and reserved at each phase).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin; xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
. bench/gpu/cublas_env.sh > /dev/null
echo '{"arch":"llama","vocab_size":128256,"d_model":8192,"n_layer":8,"n_head":64,"n_kv_head":8,"d_ff":28672,"max_seq_len":4096}' > /tmp/w70.json
.device/bin/train --plan --model /tmp/w70.json --seq-len 4096 --batch 1 --compute bf16 --lora-rank 16 --lora-alpha 32 \
  --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --gpu-mem-gib 24 --base-dtype nf4 --loss-chunk-tokens 1024 > $OUT/plan.txt 2>&1
BURN_OFFLOAD_TRACE=1 timeout 150 .device/bin/train --model /tmp/w70.json --steps 2 --lr 1e-4 --seq-len 4096 --batch 1 \
  --compute bf16 --lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj \
  --gpu-mem-gib 24 --base-dtype nf4 --loss-chunk-tokens 1024 --sample-tokens 0 --metrics $OUT/m.jsonl > $OUT/out.log 2> $OUT/trace.txt
echo "exit $?"
grep -c . $OUT/trace.txt
grep "step 1\b\|forward done\|head\|backward done\|block 7 \|block 0 " $OUT/trace.txt | head -40
