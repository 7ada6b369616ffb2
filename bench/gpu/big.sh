#!/usr/bin/env bash
# Issue 36's rows on the device, side by side in one call:
#   BIG_ROWS="7b:64:compact 7b:64:fused ..." bash bench/gpu/big.sh
# Each row is shape:thousands-of-tokens:mode, bf16 compute, sequences of
# BIG_SEQ tokens (1024; the batch is the tokens over it), global-norm clipping
# at 1.0 and the non-finite guard unless the mode says otherwise. Modes:
#   auto           the planner's choices
#   full           --host-layout full: bf16 weights and an fp32 gradient buffer (18 B/param)
#   compact        --host-layout compact: fp32 weights cast on the GPU, bf16 block gradients (14)
#   fused          --fused: clipping and the guard run the backward twice (14)
#   fused-compact  --fused --host-layout compact (12)
#   fused-noclip   --fused --no-guard --grad-clip 0: one backward, no clipping (the ceiling)
# A mode ending in -8bit adds --optim-state 8bit (8-bit Adam moments, 6 B/param less).
# Shapes: 7b (Llama-2-7B), w8-<layers> (Llama-3-8B width, GPT-2's vocabulary,
# <layers> blocks), and Llama-3's vocabulary and the long contexts' shapes
# (issue 37): 085b (the 0.85B calibration shape), l1b (Llama-3.2-1B), l3b
# (Llama-3.2-3B), l8b (Llama-3.1-8B), l70b (Llama-3.1-70B). BIG_STEPS steps (6), BIG_LIMIT seconds a row (400).
# HOST_GIB passes --host-mem-gib (the lent hosts grow RAM on demand).
# Writes $OUT/big.txt (a line a row: exit, tok/s and model/hardware TFLOPS
# medians of steps 3+, losses, host peak RSS, GPU peak from nvidia-smi, the
# memory plan line and the store line) and the rows' logs as $OUT/big-logs.tgz.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/big-work; rm -rf $W; mkdir -p $W
if [ -f .device/bin.tar.xz ]; then rm -rf .device/bin; tar xJf .device/bin.tar.xz -C .device; fi
. bench/gpu/cublas_env.sh >/dev/null
SEQ=${BIG_SEQ:-1024}
echo '{"arch":"llama","vocab_size":32000,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":32,"d_ff":11008,"max_seq_len":4096}' > $W/7b.json
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$SEQ'}' > $W/085b.json
echo '{"arch":"llama","vocab_size":128256,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":8192,"max_seq_len":'$SEQ'}' > $W/l1b.json
echo '{"arch":"llama","vocab_size":128256,"d_model":3072,"n_layer":28,"n_head":24,"n_kv_head":8,"d_ff":8192,"max_seq_len":'$SEQ'}' > $W/l3b.json
echo '{"arch":"llama","vocab_size":128256,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":8,"d_ff":14336,"max_seq_len":'$SEQ'}' > $W/l8b.json
echo '{"arch":"llama","vocab_size":128256,"d_model":8192,"n_layer":80,"n_head":64,"n_kv_head":8,"d_ff":28672,"max_seq_len":'$SEQ'}' > $W/l70b.json
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/big.txt
free -g | head -2 | tee -a $OUT/big.txt
for row in ${BIG_ROWS:-7b:64:compact 7b:64:fused}; do
  IFS=: read -r shape tok mode <<< "$row"
  tokenizer=
  case $shape in
    w8-*) tokenizer="--tokenizer gpt2"; layers=${shape#w8-}
      echo '{"arch":"llama","vocab_size":50257,"d_model":4096,"n_layer":'$layers',"n_head":32,"n_kv_head":8,"d_ff":14336,"max_seq_len":8192}' > $W/$shape.json ;;
  esac
  state=
  case $mode in *-8bit) state="--optim-state 8bit"; mode=${mode%-8bit} ;; esac
  case $mode in
    auto) extra= ;;
    full) extra="--host-layout full" ;;
    compact) extra="--host-layout compact" ;;
    fused) extra="--fused --host-layout full" ;;
    fused-compact) extra="--fused --host-layout compact" ;;
    fused-noclip) extra="--fused --host-layout full --no-guard --grad-clip 0" ;;
    *) echo "unknown mode $mode"; exit 2 ;;
  esac
  name=$shape-${tok}k-$mode${state:+-8bit}
  [ "$SEQ" = 1024 ] || name=$name-s$((SEQ / 1024))k
  batch=$(( (tok * 1024 + SEQ - 1) / SEQ ))
  args="--model $W/$shape.json $tokenizer --steps ${BIG_STEPS:-6} --warmup 2 --lr 1e-4 --seq-len $SEQ --batch $batch --compute bf16 $extra $state ${HOST_GIB:+--host-mem-gib $HOST_GIB} ${ARGS:-}"
  .device/bin/train --plan $args > $W/$name.plan 2>&1
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $W/$name.gpu &
  smi=$!
  /usr/bin/time -v timeout ${BIG_LIMIT:-400} .device/bin/train $args --sample-tokens 0 \
    --metrics $W/$name.jsonl > $W/$name.log 2> $W/$name.err
  status=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  python3 - "$W" "$name" "$status" <<'PY' | tee -a $OUT/big.txt
import json, re, statistics, sys
w, name, status = sys.argv[1:]
rows = []
try:
    # Step rows only (a resumed run's first line says where it resumed from).
    rows = [r for r in (json.loads(l) for l in open(f"{w}/{name}.jsonl") if l.strip()) if "step_s" in r]
except OSError:
    pass
err = open(f"{w}/{name}.err", errors="replace").read()
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
gpu = [int(x) for x in open(f"{w}/{name}.gpu").read().split() if x.isdigit()]
lines = lambda p: [l for l in err.splitlines() if l.startswith(p)]
med = lambda k: round(statistics.median(r[k] for r in rows[2:]), 1) if len(rows) > 2 else None
print(f"{name} exit {status} tok/s {med('tokens_per_s')} model_tflops {med('model_tflops')}"
      f" hardware_tflops {med('hardware_tflops')} steps {[round(r['step_s'], 2) for r in rows]}"
      f" losses {[r['loss'] and round(r['loss'], 4) for r in rows]} skipped {sum(bool(r.get('skipped')) for r in rows)}"
      f" host_peak_gib {rss and round(int(rss.group(1)) / 2**20, 1)} gpu_peak_gib {gpu and round(max(gpu) / 1024, 1)}")
for l in lines("memory plan") + lines("host store ready"):
    print("  " + l)
if status != "0":
    plan = open(f"{w}/{name}.plan", errors="replace").read().strip().splitlines()
    print("  plan: " + (plan[-1] if plan else ""))
    print("  " + " | ".join(l for l in err.splitlines() if l.strip() and not l.startswith(("\t", " ")))[-600:])
PY
done
tar czf $OUT/big-logs.tgz -C $W .
