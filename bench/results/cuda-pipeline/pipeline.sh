#!/usr/bin/env bash
# GPU runs of the streamed engine (issues 4 and 9), in parts:
#   bash bench/gpu/pipeline.sh parity depth 7b pipeline
# parity: the engine parity tests on CUDA; pipeline: pipelined vs serialised
# copies vs resident burn; depth: GPU memory at 12 and 48 layers; 7b: a 7.39B
# fp32-master run. Run from the repository root with the stripped binaries in
# .device/bin (train, engine-tests); results in $OUT/results.tgz.
set -u
B=.device/bin/train
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Everything lands in $W; a tarball of it is refreshed in $OUT after each run
# (few files come back from the device machine, and a timed-out call keeps it).
FINAL=$OUT; W=/tmp/bench-work; rm -rf $W; mkdir -p $W; OUT=$W
pack() { tar czf $FINAL/results.tgz -C $W . ; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
free -g | tee -a $OUT/gpu.txt
# Llama shape of ~0.85B (16 layers, hidden 2048, GQA 32/8), the issue's calibration shape.
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":2048}' > /tmp/llama-0.85b.json

# Peak GPU memory of one run: poll nvidia-smi while it runs.
run() {
  local name=$1; shift
  echo "== $name: $*"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $OUT/$name.gpumem &
  local poll=$!
  local t0=$(date +%s.%N)
  /usr/bin/time -v timeout ${LIMIT:-150} $B "$@" --metrics $OUT/$name.jsonl --sample-tokens 0 > $OUT/$name.log 2> $OUT/$name.err
  echo "exit $?"
  local wall=$(python3 -c "print($(date +%s.%N) - $t0)")
  kill $poll 2>/dev/null
  grep -E 'Maximum resident|Elapsed' $OUT/$name.err
  local gpu_peak=$(sort -n $OUT/$name.gpumem | tail -1)
  grep -v '^\s' $OUT/$name.err | tail -3 > $OUT/$name.tail; rm -f $OUT/$name.gpumem $OUT/$name.log $OUT/$name.err
  touch $OUT/$name.jsonl
  python3 - "$OUT/$name.jsonl" "$wall" "$gpu_peak" <<'PY' | tee $OUT/$name.summary.json
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if len(rows) < 3: print("too few steps", len(rows)); sys.exit()
steady = rows[2:]
med = lambda k: statistics.median(r[k] for r in steady if r.get(k) is not None)
line = {"steps": len(rows), "tok_s_median": med("tokens_per_s"), "step_s_median": med("step_s"),
        "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"],
        "losses": [round(r["loss"], 4) for r in rows],
        "wall_s": float(sys.argv[2]), "before_first_step_s": float(sys.argv[2]) - sum(r["step_s"] for r in rows),
        "host_rss_gb_max": max(r["rss_bytes"] or 0 for r in rows) / 1e9,
        "gpu_peak_mib": int(sys.argv[3] or 0)}
if rows[-1].get("bytes_to_device") is not None:
    line["upload_wait_s_median"] = med("upload_wait_s")
    line["h2d_gb_per_step"] = rows[-1]["bytes_to_device"] / 1e9
    line["d2h_gb_per_step"] = rows[-1]["bytes_to_host"] / 1e9
print(json.dumps(line))
PY
  pack
}

for part in "$@"; do case $part in
parity)
# Parity of the engine with plain burn, on CUDA (tolerances in tests/tests/engine.rs).
echo "== parity tests on CUDA"
timeout 200 .device/bin/engine-tests --test-threads 1 > $OUT/parity.txt 2>&1
grep -E "^test |panicked|relative|test result" $OUT/parity.txt; pack
;;
pipeline)
# Resident burn keeps every activation: at 8k tokens it ran out of the 80 GB.
S="--model /tmp/llama-0.85b.json --steps 7 --warmup 1 --lr 3e-4 --seq-len 1024"
run 085b-4k-resident $S --batch 4 --resident
run 085b-4k-pipelined $S --batch 4
run 085b-4k-serial $S --batch 4 --serial-copies
run 085b-16k-pipelined $S --batch 16
run 085b-16k-serial $S --batch 16 --serial-copies
;;
depth)
# GPU memory flat in depth: the same width at 12 and 48 layers.
for L in 12 48; do
  echo '{"arch":"llama","vocab_size":32000,"d_model":1024,"n_layer":'$L',"n_head":16,"n_kv_head":16,"d_ff":2816,"max_seq_len":1024}' > /tmp/depth-$L.json
  $B --plan --model /tmp/depth-$L.json --batch 8 --seq-len 512 > $OUT/depth-$L.plan
  run depth-$L --model /tmp/depth-$L.json --steps 4 --warmup 1 --lr 3e-4 --batch 8 --seq-len 512
done
;;
7b)
# >= 7B with fp32 master weights and fp32 Adam, which cannot be trained
# resident on 80 GB: the Llama-3-8B shape with GPT-2's BPE (vocab 50257) has
# 7.39B parameters. Fused (12 B/param on the host; 16 B/param did not leave
# the 125 GiB host enough headroom), unguarded and unclipped so the backward
# runs once per step.
M7="--model llama-8b --tokenizer gpt2 --batch 4 --seq-len 1024 --fused --no-guard --grad-clip 0"
$B --plan $M7 | tee $OUT/llama7b.plan
LIMIT=${LIMIT_7B:-400} run llama7b-4k $M7 --steps 12 --warmup 3 --lr 1e-4
;;
largest)
# The largest Llama-8B-wide model the planner accepts on this machine.
for L in 48 46 44 42 40 38 36; do
  echo '{"arch":"llama","vocab_size":50257,"d_model":4096,"n_layer":'$L',"n_head":32,"n_kv_head":8,"d_ff":14336,"max_seq_len":8192}' > /tmp/largest.json
  ML="--model /tmp/largest.json --tokenizer gpt2 --batch 4 --seq-len 1024 --fused --no-guard --grad-clip 0"
  $B --plan $ML > $OUT/largest-$L.plan 2>&1
  if grep -q '^fits' $OUT/largest-$L.plan; then
    echo "planner accepts $L layers"; cat $OUT/largest-$L.plan
    LIMIT=${LIMIT_LARGEST:-300} run largest-${L}l $ML --steps 4 --warmup 1 --lr 1e-4
    break
  fi
done
;;
*) echo "unknown part $part (parity, pipeline, depth, 7b)"; exit 2 ;;
esac; done
pack
