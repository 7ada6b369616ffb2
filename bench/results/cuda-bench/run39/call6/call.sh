#!/usr/bin/env bash
# run39 call 6 (nvidia-h100-x1), issue 50: the recompute takes each block's
# attention output from the forward (EngineConfig::keep_attention, placed by
# the planner where it fits). 0.85B, bf16, batch 1, one sequence a step:
# at 131,072 tokens this tree's train (b: attention kept) against call 5's
# (a: the merged tree without it; the same losses show the kept outputs are
# the forward's) and MegaTrain's engine, in one call; at 262,144 this
# tree's alone (MegaTrain's 262k row is call 3's).
# Binaries in .device/ab (train-a.xz: call 5's b; train-b.xz: this tree).
set -u
mkdir -p .device/a .device/b /tmp/logs
xz -dc .device/ab/train-a.xz > .device/a/train; xz -dc .device/ab/train-b.xz > .device/b/train
chmod +x .device/a/train .device/b/train
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
. bench/gpu/cublas_env.sh > /dev/null
row() { # build seq steps limit
  s=$2
  echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/085b-$s.json
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-$1-$s.txt &
  smi=$!
  /usr/bin/time -v timeout $4 .device/$1/train --model /tmp/085b-$s.json --steps $3 --warmup 1 --lr 1e-4 --seq-len $s --batch 1 \
    --compute bf16 --sample-tokens 0 --metrics /tmp/logs/$1-$s.jsonl > /tmp/logs/$1-$s.log 2>&1
  echo "$1 $s: exit $? $(grep -E 'Maximum resident' /tmp/logs/$1-$s.log) GPU peak MiB $(sort -n /tmp/logs/gpu-$1-$s.txt | tail -1)" | tee -a $S
  kill $smi
  grep -E '^step|take their attention|keep their' /tmp/logs/$1-$s.log | tee -a $S
}
row a 131072 4 100
row b 131072 4 100
timeout 130 python3 bench/peers/megatrain_llama.py --config /tmp/085b-131072.json --batch 1 --seq-len 131072 --steps 4 \
  --warmup-steps 2 --lr 3e-4 --dtype bf16 2> /tmp/logs/megatrain-131072.err | tail -1 | tee -a $S
row b 262144 3 190
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
