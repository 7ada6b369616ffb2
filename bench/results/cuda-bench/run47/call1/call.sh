#!/usr/bin/env bash
# run47 call 1 (nvidia-h200), issue 53: the GPU budget with the pools held
# under it (vendor/cubecl-cuda PATCH.md, fourth change: a device-wide
# ceiling, pages of an eighth of the budget, one oversize pool for the f32
# embedding drawn while the store is built).
# 1. run46 call 6's diagnostic again: the Llama-3.1-70B width with 8 blocks,
#    LoRA r16 on every projection, NF4 base, --gpu-mem-gib 24, 2 steps, the
#    phase trace (pools in use / reserved / pages past the budget).
# 2. run46 call 3's row again: the whole Llama-3.1-70B shape, NF4 base,
#    --gpu-mem-gib 24, 4,096 tokens a step, 5 steps, GPU peak by nvidia-smi.
# Binaries in .device/lora.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin; xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
. bench/gpu/cublas_env.sh > /dev/null
LORA="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --gpu-mem-gib 24"
echo '{"arch":"llama","vocab_size":128256,"d_model":8192,"n_layer":8,"n_head":64,"n_kv_head":8,"d_ff":28672,"max_seq_len":4096}' > /tmp/w70.json
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $OUT/w70.gpu & smi=$!
BURN_OFFLOAD_TRACE=1 timeout 150 .device/bin/train --model /tmp/w70.json --steps 2 --lr 1e-4 --seq-len 4096 --batch 1 \
  --compute bf16 $LORA --base-dtype nf4 --sample-tokens 0 --metrics $OUT/w70.jsonl > $OUT/w70.log 2> $OUT/trace.txt
echo "w70 exit $? gpu_peak_mib $(sort -n $OUT/w70.gpu | tail -1)" | tee $OUT/summary.txt
kill $smi; wait $smi 2>/dev/null
BIG_SEQ=4096 BIG_STEPS=5 BIG_LIMIT=330 BIG_ROWS="l70b:4:auto" ARGS="$LORA --base-dtype nf4" bash bench/gpu/big.sh > /dev/null 2>&1
cp /tmp/big-work/*.plan $OUT/plan-nf4.txt; tail -1 /tmp/big-work/*.jsonl > $OUT/last-step-nf4.json
cat $OUT/big.txt >> $OUT/summary.txt
cat $OUT/summary.txt
