#!/usr/bin/env bash
# Device timelines of training steps (bench/gpu/timeline/cupti_trace.c):
#   TL_SYSTEMS="pipelined serial resident" TL_TOKENS=16 bash bench/gpu/timeline/run.sh
# Each system runs the 0.85B Llama for TL_STEPS steps with CUPTI recording;
# timeline.py splits the steps and writes $OUT/timeline-<name>.{txt,json}.
# ARGS adds train flags; TL_COMPUTE (fp32) picks the precision; TAG names the rows. Needs .device/bin.tar.xz (train)
# and .device/timeline.tar.xz (bench/gpu/timeline/build.sh).
set -u
if [ -f .device/bin.tar.xz ]; then rm -rf .device/bin; tar xJf .device/bin.tar.xz -C .device; fi
rm -rf .device/timeline; tar xJf .device/timeline.tar.xz -C .device
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/timeline-work; mkdir -p $W
. bench/gpu/cublas_env.sh
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":2048}' > /tmp/llama-0.85b.json
steps=${TL_STEPS:-5}
for b in ${TL_TOKENS:-16}; do for sys in ${TL_SYSTEMS:-pipelined serial resident}; do
  name=085b-${b}k-$sys${TAG:+@$TAG}
  extra=; [ $sys = serial ] && extra=--serial-copies; [ $sys = resident ] && extra=--resident
  echo "== $name"
  CUDA_INJECTION64_PATH=$PWD/.device/timeline/cupti_trace.so CUPTI_TRACE_OUT=$W/$name.trace \
    timeout ${TL_LIMIT:-150} .device/bin/train --model /tmp/llama-0.85b.json --steps $steps --warmup 1 --lr 3e-4 \
    --seq-len 1024 --batch $b --compute ${TL_COMPUTE:-fp32} $extra ${ARGS:-} --sample-tokens 0 --metrics $W/$name.jsonl > $W/$name.log 2> $W/$name.err
  echo "exit $?"; grep -v '^\s' $W/$name.err | tail -3
  python3 -c "
import json,statistics,sys
r=[json.loads(l) for l in open('$W/$name.jsonl') if l.strip()][2:]
print('tok/s median', statistics.median(x['tokens_per_s'] for x in r), 'steps', [round(x['step_s'],3) for x in r])" | tee $OUT/timeline-$name.txt
  ls -la $W/$name.trace
  python3 bench/gpu/timeline/timeline.py $W/$name.trace $W/$name.jsonl --json $OUT/timeline-$name.json | tee -a $OUT/timeline-$name.txt
  xz -T8 -c $W/$name.trace > $W/$name.trace.xz; ls -la $W/$name.trace.xz
  rm $W/$name.trace
  # Few files come back from the device: everything in one tarball.
  tar czf $OUT/timeline.tgz -C $W .
done; done
