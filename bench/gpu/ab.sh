#!/usr/bin/env bash
# Same-machine A/B of train builds, rows interleaved so that a slow spell of
# the host (the GPU machine differs from call to call, and drifts within one)
# falls on every build alike:
#   AB_BUILDS="new old" AB_SYSTEMS="pipelined serial" AB_ROUNDS=2 bash bench/gpu/ab.sh
# Each build NAME is .device/ab-NAME.tar.xz (a tarball of one `bin/train`);
# NAME+ARG runs build NAME with one more train argument ARG (`--flag=value`):
#   AB_BUILDS="new new+--worker-nice=0 old" AB_SYSTEMS=pipelined bash bench/gpu/ab.sh
# Each round runs every system with every build once (0.85B Llama, AB_COMPUTE
# (fp32) precision, AB_TOKENS sequences of AB_SEQ (1024) tokens per step, AB_STEPS steps of
# which the first two are left out); $OUT/ab.txt lists the medians, $OUT/ab.tgz holds the metrics.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/ab-work; mkdir -p $W
# libcublas, which `--matmul fast` uses for bf16.
. bench/gpu/cublas_env.sh
SEQ=${AB_SEQ:-1024}
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$((SEQ > 2048 ? SEQ : 2048))'}' > /tmp/llama-0.85b.json
for b in $(for b in ${AB_BUILDS:?name the builds}; do echo ${b%%+*}; done | sort -u); do
  rm -rf .device/ab-$b; mkdir -p .device/ab-$b
  tar xJf .device/ab-$b.tar.xz -C .device/ab-$b --strip-components 1
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/ab.txt
for r in $(seq 1 ${AB_ROUNDS:-2}); do for sys in ${AB_SYSTEMS:-pipelined serial}; do for b in $AB_BUILDS; do
  name=$sys-$b-r$r
  extra=; [ $sys = serial ] && extra=--serial-copies
  case $b in *+*) extra="$extra ${b#*+}";; esac
  timeout ${AB_LIMIT:-90} .device/ab-${b%%+*}/train --model /tmp/llama-0.85b.json --steps ${AB_STEPS:-7} --warmup 1 \
    --lr 3e-4 --seq-len $SEQ --batch ${AB_TOKENS:-16} --compute ${AB_COMPUTE:-fp32} $extra --sample-tokens 0 \
    --metrics $W/$name.jsonl > $W/$name.log 2> $W/$name.err
  python3 - $W/$name.jsonl $name <<'PY' | tee -a $OUT/ab.txt
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][2:]
if not rows:
    print(sys.argv[2], "no steady steps")
else:
    med = lambda f: statistics.median(f(r) for r in rows)
    h2d = med(lambda r: r["split"]["forward_h2d_bytes"] / max(r["split"]["forward_h2d_copy_s"], 1e-9) / 1e9)
    print(sys.argv[2], "tok/s median %.0f" % med(lambda r: r["tokens_per_s"]),
          "forward %.3f s" % med(lambda r: r["split"]["forward_s"]),
          "backward %.3f s" % med(lambda r: r["split"]["backward_s"]),
          "forward H2D %.1f GB/s" % h2d,
          "steps", [round(r["step_s"], 3) for r in rows],
          "last loss", rows[-1]["loss"])
PY
  tar czf $OUT/ab.tgz -C $W .
done; done; done
