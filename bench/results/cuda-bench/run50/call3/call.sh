#!/usr/bin/env bash
# run50 call 3 (nvidia-h200), issue 50: training with the CubeCL fallback
# (--attention cubecl), 0.85B Llama shape, 6 steps (median of steps 3-6):
# this tree's train (.device/train50) against main's attention
# (.device/train49c, 690a727: its attention kernels are main's), two
# interleaved rounds, at
# - one 16,384-token sequence a step, bf16 (the long rows);
# - 1,024-token sequences: 64 a step in bf16, 16 a step in fp32 (the
#   issue's no-slowdown rows).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
xz -dc .device/train50/train.xz > .device/x/train-new; xz -dc .device/train49c/train.xz > .device/x/train-main
chmod +x .device/x/train-*
. bench/gpu/cublas_env.sh > /dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
model() { echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$1'}' > /tmp/085b-$1.json; }
model 16384; model 1024
for r in 1 2; do
  for shape in 16384:1:bf16 1024:64:bf16 1024:16:fp32; do
    IFS=: read s b c <<< "$shape"
    for bin in new main; do
      tag=$bin-$s-$b-$c-$r
      timeout 150 .device/x/train-$bin --model /tmp/085b-$s.json --steps 6 --warmup 2 --lr 1e-4 --seq-len $s --batch $b \
        --compute $c --sample-tokens 0 --attention cubecl --metrics $OUT/train-$tag.jsonl > $OUT/train-$tag.log 2>&1
      echo "$tag: exit $?" >> $OUT/train.txt
      python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; r=[x for x in r if 'tokens_per_s' in x][2:]; print(sys.argv[2], 'median tok/s', round(statistics.median(x['tokens_per_s'] for x in r)), 'losses', [round(x.get('loss',0),4) for x in r])" $OUT/train-$tag.jsonl $tag >> $OUT/train.txt 2>&1
    done
  done
done
cat $OUT/train.txt
cd $OUT && tar czf logs.tgz train-*.log train-*.jsonl && rm -f train-*.log train-*.jsonl
