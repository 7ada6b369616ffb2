#!/usr/bin/env bash
# run45 call 5 (nvidia-h200), issue 53, diagnostic: where an NF4 base's
# steps go. LoRA r16 on every projection of the Llama-3.1-8B shape, 4,096
# tokens, 2 steps each with --base-dtype int8 and nf4, phase trace on
# (BURN_OFFLOAD_TRACE=1) for nf4.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin; xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
. bench/gpu/cublas_env.sh > /dev/null
echo '{"arch":"llama","vocab_size":128256,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":8,"d_ff":14336,"max_seq_len":4096}' > /tmp/l8b.json
for base in int8 nf4; do
  trace=; [ $base = nf4 ] && trace=1
  BURN_OFFLOAD_TRACE=$trace timeout 100 .device/bin/train --model /tmp/l8b.json --steps 2 --warmup 1 --lr 1e-4 \
    --seq-len 4096 --batch 1 --compute bf16 --lora-rank 16 --lora-alpha 32 \
    --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --base-dtype $base \
    --sample-tokens 0 --metrics $OUT/$base.jsonl > $OUT/$base.log 2> $OUT/$base.err
  echo "$base exit $?"
  grep -E "store ready|step 2/2" $OUT/$base.err | tail -2
done
grep -c . $OUT/nf4.err
