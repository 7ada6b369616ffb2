#!/usr/bin/env bash
# run46 call 4 (nvidia-h200), issue 53, diagnostic: where call 3's 70B NF4
# LoRA run asked cubecl for one 4.2 GB buffer (over the 3 GiB pages that
# --gpu-mem-gib 24 allows): the same run with the phase trace on.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin; xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
. bench/gpu/cublas_env.sh > /dev/null
echo '{"arch":"llama","vocab_size":128256,"d_model":8192,"n_layer":80,"n_head":64,"n_kv_head":8,"d_ff":28672,"max_seq_len":4096}' > /tmp/l70b.json
BURN_OFFLOAD_TRACE=1 RUST_BACKTRACE=1 timeout 90 .device/bin/train --model /tmp/l70b.json --steps 1 --lr 1e-4 --seq-len 4096 --batch 1 \
  --compute bf16 --lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj \
  --gpu-mem-gib 24 --base-dtype nf4 --sample-tokens 0 > $OUT/out.log 2> $OUT/err.log
echo "exit $?"
grep -v "^ *[0-9]*: 0x\|^ *at \?\?" $OUT/err.log | head -60
