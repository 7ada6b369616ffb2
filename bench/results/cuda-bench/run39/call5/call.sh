#!/usr/bin/env bash
# run39 call 5 (nvidia-h100-x1), issue 50: does the merge of packed-document
# boundaries (9eda022) slow training? A/B in one call, interleaved: the
# train binary of call 1 (f4d7def's tree) against this tree's, carried as
# .device/ab/train-a.xz and train-b.xz, 0.85B, bf16, one 16,384-token sequence a step (two rounds)
# and 64 sequences of 1,024 (one round), median tok/s of steps 3+.
set -u
mkdir -p .device/a .device/b /tmp/logs
xz -dc .device/ab/train-a.xz > .device/a/train; xz -dc .device/ab/train-b.xz > .device/b/train
chmod +x .device/a/train .device/b/train
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
. bench/gpu/cublas_env.sh > /dev/null
row() { # build seq batch round
  s=$2
  echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/085b-$s.json
  timeout 90 .device/$1/train --model /tmp/085b-$s.json --steps 6 --warmup 2 --lr 1e-4 --seq-len $s --batch $3 \
    --compute bf16 --sample-tokens 0 --metrics /tmp/logs/$1-$s-$4.jsonl > /tmp/logs/$1-$s-$4.log 2>&1
  python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; r=[x for x in r if 'tokens_per_s' in x][2:]; print(sys.argv[2], 'median tok/s', round(statistics.median(x['tokens_per_s'] for x in r)))" /tmp/logs/$1-$s-$4.jsonl "$1 ${s}x$3 round $4" | tee -a $S
}
for r in 1 2; do row a 16384 1 $r; row b 16384 1 $r; done
row a 1024 64 1; row b 1024 64 1
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
