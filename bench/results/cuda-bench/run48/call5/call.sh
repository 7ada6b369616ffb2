#!/usr/bin/env bash
# run48 call 5 (nvidia-h200), issue 50: training with the CubeCL fallback,
# 0.85B Llama shape, bf16, one 16,384-token sequence a step, 6 steps (median
# of steps 3-6): this tree's train (.device/train48, e23fa2f) and main's
# (.device/trainbase, 57b2ac9) with --attention cubecl, and this tree's with
# --attention auto (cuDNN), two interleaved rounds.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
xz -dc .device/train48/train.xz > .device/x/train-new; xz -dc .device/trainbase/train.xz > .device/x/train-main
chmod +x .device/x/train-*
. bench/gpu/cublas_env.sh > /dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
s=16384
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/085b.json
for r in 1 2; do
  for row in new:cubecl main:cubecl new:auto; do
    b=${row%%:*}; att=${row##*:}; tag=$b-$att-$r
    timeout 150 .device/x/train-$b --model /tmp/085b.json --steps 6 --warmup 2 --lr 1e-4 --seq-len $s --batch 1 \
      --compute bf16 --sample-tokens 0 --attention $att --metrics $OUT/train-$tag.jsonl > $OUT/train-$tag.log 2>&1
    echo "$tag: exit $?" >> $OUT/train.txt
    grep -m1 "attention:" $OUT/train-$tag.log >> $OUT/train.txt
    python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; r=[x for x in r if 'tokens_per_s' in x][2:]; print(sys.argv[2], 'median tok/s', round(statistics.median(x['tokens_per_s'] for x in r)), 'losses', [round(x.get('loss',0),4) for x in r])" $OUT/train-$tag.jsonl $tag >> $OUT/train.txt
  done
done
cat $OUT/train.txt
cd $OUT && tar czf logs.tgz train-*.log train-*.jsonl && rm -f train-*.log train-*.jsonl
