#!/usr/bin/env bash
# First CUDA runs of the (not yet pipelined) engine vs resident burn: a baseline for issue 9.
set -u
B=.device/bin/train
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":8,"n_head":16,"n_kv_head":8,"d_ff":5632,"max_seq_len":2048}' > /tmp/llama-0.6b.json
run() { local name=$1; shift; echo "== $name: $*"; /usr/bin/time -v $B "$@" --metrics $OUT/$name.jsonl --sample-tokens 8 2> $OUT/$name.err | tail -3; grep -E 'Maximum resident|Elapsed' $OUT/$name.err; tail -2 $OUT/$name.jsonl | cut -c1-300; }
run tiny-engine --model llama-tiny --steps 20 --batch 8 --seq-len 64
run tiny-resident --model llama-tiny --steps 20 --batch 8 --seq-len 64 --resident
run 0.6b-engine --model /tmp/llama-0.6b.json --steps 6 --batch 4 --seq-len 1024 --warmup 1
run 0.6b-resident --model /tmp/llama-0.6b.json --steps 6 --batch 4 --seq-len 1024 --warmup 1 --resident
