#!/usr/bin/env bash
# The type parameter's rows (issue 35) on the device, side by side in one call:
#   TP_ROWS="085b:4:resident 085b:4:host ..." bash bench/gpu/typeparam.sh
# Each row is shape:thousands-of-tokens:mode, mode one of
#   resident  plain burn, Autodiff<Gemm<Cuda>> + burn-optim AdamW (--resident)
#   host      Autodiff<Offload<Gemm<Cuda>>> + the host AdamW (--resident --host-params)
#   host1g    the same with the parameter cache held to 1 GiB (--param-cache-gib 1)
#   engine    the block-streamed engine
#   fused     the engine with --fused (12 B/param on the host: what fits a 7B in fp32)
# A fourth field names another build: shape:tok:mode:NAME runs
# .device/ab-NAME.tar.xz's bin/train (as bench/gpu/ab.sh packs them), to set
# two builds' rows side by side in one call.
# Shapes: 085b (the 0.85B Llama), 7b (Llama-2-7B) and 7b16 (its first 16 layers:
# the same width, for GPU peaks against depth). fp32 compute, sequences
# of 1024 tokens, TP_STEPS steps (6). Needs .device/bin.tar.xz (bin/train).
# Writes $OUT/typeparam.txt (one line a row: exit, tok/s median of steps 3+,
# host peak RSS, GPU peak from nvidia-smi, the run's offload line) and the
# rows' logs as $OUT/typeparam-logs.tgz.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/typeparam-work; rm -rf $W; mkdir -p $W
if [ -f .device/bin.tar.xz ]; then rm -rf .device/bin; tar xJf .device/bin.tar.xz -C .device; fi
. bench/gpu/cublas_env.sh >/dev/null
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":2048}' > $W/085b.json
echo '{"arch":"llama","vocab_size":32000,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":32,"d_ff":11008,"max_seq_len":4096}' > $W/7b.json
echo '{"arch":"llama","vocab_size":32000,"d_model":4096,"n_layer":16,"n_head":32,"n_kv_head":32,"d_ff":11008,"max_seq_len":4096}' > $W/7b16.json
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $OUT/typeparam.txt
for row in ${TP_ROWS:-085b:4:resident 085b:4:host 085b:16:resident 085b:16:host}; do
  IFS=: read -r shape tok mode build <<< "$row"
  bin=.device/bin/train
  if [ -n "$build" ]; then
    [ -x .device/ab-$build/train ] || { mkdir -p .device/ab-$build; tar xJf .device/ab-$build.tar.xz -C .device/ab-$build --strip-components 1; }
    bin=.device/ab-$build/train
  fi
  extra=--resident; [ $mode = host ] && extra="--resident --host-params"; [ $mode = engine ] && extra=
  [ $mode = host1g ] && extra="--resident --host-params --param-cache-gib 1"
  [ $mode = fused ] && extra=--fused
  name=$shape-${tok}k-$mode${build:+-$build}
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $W/$name.gpu &
  smi=$!
  /usr/bin/time -v timeout ${TP_LIMIT:-200} $bin --model $W/$shape.json --steps ${TP_STEPS:-6} \
    --warmup 1 --lr 3e-4 --seq-len 1024 --batch $tok --compute fp32 $extra ${ARGS:-} --sample-tokens 0 \
    --metrics $W/$name.jsonl > $W/$name.log 2> $W/$name.err
  status=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  python3 - "$W" "$name" "$status" <<'EOF' | tee -a $OUT/typeparam.txt
import json, re, statistics, sys
w, name, status = sys.argv[1:]
rows = []
try:
    rows = [json.loads(l) for l in open(f"{w}/{name}.jsonl") if l.strip()]
except OSError:
    pass
err = open(f"{w}/{name}.err", errors="replace").read()
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
gpu = [int(x) for x in open(f"{w}/{name}.gpu").read().split() if x.isdigit()]
offload = [l for l in err.splitlines() if l.startswith("offload:")]
offload += [l.split("; ", 1)[-1] for l in err.splitlines() if l.startswith("parameter cache:")]
tok = statistics.median(r["tokens_per_s"] for r in rows[2:]) if len(rows) > 2 else None
steady = [r for r in rows[2:] if r.get("host_update_s") is not None]
host = (f" host_update_s {statistics.median(r['host_update_s'] for r in steady):.3f}"
        f" paged_gb_per_step {statistics.median(r['paged_in_bytes'] for r in steady) / 1e9:.2f}") if steady else ""
print(f"{name} exit {status} tok/s {tok and round(tok)} steps {[round(r['step_s'], 3) for r in rows]}"
      f" losses {[round(r['loss'], 4) for r in rows]} host_peak_gib {rss and round(int(rss.group(1)) / 2**20, 1)}"
      f" gpu_peak_gib {gpu and round(max(gpu) / 1024, 1)}{host} {'; '.join(offload)}")
if status != "0":
    print("  " + " | ".join(l for l in err.splitlines() if l.strip() and not l.startswith(("\t", " ")))[-600:])
EOF
done
tar czf $OUT/typeparam-logs.tgz -C $W .
