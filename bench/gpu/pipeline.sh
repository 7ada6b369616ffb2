#!/usr/bin/env bash
# GPU runs of the streamed engine (issues 4 and 9), in parts:
#   bash bench/gpu/pipeline.sh parity depth 7b pipeline
# parity: the engine parity tests on CUDA; pipeline: pipelined vs serialised
# copies vs resident burn; depth: GPU memory at 12 and 48 layers; 7b: a 7.39B
# fp32-master run; largest: the largest model the planner accepts; peers:
# PyTorch on the same shape. Run from the repository root with the stripped
# binaries in .device/bin (train, *-tests) or .device/bin.tar.xz; results in
# $OUT/results.tgz. bench/gpu/binaries.sh builds and packs the binaries.
# MATMUL=<kernel> passes `--matmul <kernel>` to every burn row; the bench-*
# parts then name their burn rows ...-<system>@<kernel> and skip PyTorch's, so
#   bash bench/gpu/pipeline.sh bench-bf16; MATMUL=matmul_simple_tma_mma bash bench/gpu/pipeline.sh bench-bf16
# puts both into one results.tgz.
# On a machine with its own build (`cargo xtask bench cuda run`), TRAIN_BIN
# names the train binary and WORK the folder the rows' files land in.
set -u
# The binaries travel xz-compressed (the device tool carries 64 MiB per call).
if [ -z "${TRAIN_BIN:-}" ] && [ -f .device/bin.tar.xz ]; then rm -rf .device/bin; tar xJf .device/bin.tar.xz -C .device; fi
# An earlier build, for before/after rows (BENCH_OLD); it unpacks as bin-old.
if [ -f .device/bin-old.tar.xz ]; then rm -rf .device/bin-old; mkdir -p .device/bin-old; tar xJf .device/bin-old.tar.xz -C .device/bin-old --strip-components 1; fi
B=${TRAIN_BIN:-.device/bin/train}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# libcublas for MATMUL=cublas and the gemm tests' cuBLAS case.
. bench/gpu/cublas_env.sh
# Everything lands in $W; a tarball of it is refreshed in $OUT after each run
# (few files come back from the device machine, and a timed-out call keeps it).
# Several invocations in one device call add to the same $W (the machine
# starts bare each call, so nothing older is there to mix in). RESULTS names
# another work folder and tarball. With WORK the caller keeps the folder
# itself, where it wants it, so no tarball is made.
R=${RESULTS:-results}
FINAL=$OUT; W=${WORK:-/tmp/bench-work-$R}; mkdir -p "$W"; OUT=$W
pack() { [ -n "${WORK:-}" ] || tar czf $FINAL/$R.tgz -C $W . ; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
free -g | tee -a $OUT/gpu.txt
# Llama shape of ~0.85B (16 layers, hidden 2048, GQA 32/8), the issue's calibration shape.
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":2048}' > /tmp/llama-0.85b.json

# One training run: the planner's prediction first (`--plan`), then the run
# with nvidia-smi polled for the whole-process GPU peak and the share of time
# the GPU ran a kernel (NVML's utilization.gpu, averaged over the steady
# steps: the time idle between kernels), and /usr/bin/time for the host peak.
# TRACE=1 keeps the engine's phase trace ($name.trace).
run() {
  local name=$1; shift
  echo "== $name: $*"
  if [ -n "${MATMUL:-}" ]; then set -- "$@" --matmul "$MATMUL"; fi
  set -- "$@" ${ARGS:-}
  $B --plan "$@" > $OUT/$name.plan 2>&1
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader,nounits -lms 100 > $OUT/$name.gpumem &
  local poll=$!
  local t0=$(date +%s.%N)
  BURN_OFFLOAD_TRACE=${TRACE:-0} /usr/bin/time -v timeout ${LIMIT:-150} $B "$@" --metrics $OUT/$name.jsonl --sample-tokens ${SAMPLE:-0} > $OUT/$name.log 2> $OUT/$name.err
  echo "exit $?"
  local t1=$(date +%s.%N)
  local wall=$(python3 -c "print($t1 - $t0)")
  kill $poll 2>/dev/null
  grep -E 'Maximum resident|Elapsed|host store ready|forward graph' $OUT/$name.err
  local gpu_peak=$(cut -d, -f2 $OUT/$name.gpumem | sort -n | tail -1)
  local host_peak_kib=$(grep 'Maximum resident' $OUT/$name.err | awk '{print $NF}')
  local ready=$(grep 'host store ready' $OUT/$name.err | head -1)
  if [ "${TRACE:-0}" != 0 ]; then grep '^\[trace\]' $OUT/$name.err > $OUT/$name.trace; fi
  grep -v '^\s' $OUT/$name.err | grep -v '^\[trace\]' | tail -4 > $OUT/$name.tail
  grep -E '^matmul |^  declined' $OUT/$name.err > $OUT/$name.matmul  # --matmul's own counters
  cp $OUT/$name.log $OUT/$name.stdout 2>/dev/null
  rm -f $OUT/$name.log $OUT/$name.err
  touch $OUT/$name.jsonl
  python3 - "$OUT/$name.jsonl" "$wall" "$gpu_peak" "${host_peak_kib:-0}" "$ready" "$OUT/$name.gpumem" "$t1" <<'PY' | tee $OUT/$name.summary.json
import datetime, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
line = {"steps": len(rows), "wall_s": float(sys.argv[2]), "gpu_peak_mib": int(sys.argv[3] or 0),
        "host_peak_gib": int(sys.argv[4]) / 2**20, "store_ready": sys.argv[5]}
if len(rows) >= 3:
    steady = rows[2:]
    med = lambda k: statistics.median(r[k] for r in steady if r.get(k) is not None)
    line.update({"tok_s_median": med("tokens_per_s"), "step_s_median": med("step_s"),
        "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"],
        "losses": [None if r["loss"] is None else round(r["loss"], 4) for r in rows],
        "before_first_step_s": float(sys.argv[2]) - sum(r["step_s"] for r in rows),
        "host_rss_step_end_gib_max": max(r["rss_bytes"] or 0 for r in rows) / 2**30,
        "gpu_reserved_gib_max": max(r.get("gpu_reserved_bytes") or 0 for r in rows) / 2**30})
    peaks = [r["rss_peak_bytes"] for r in rows if r.get("rss_peak_bytes")]
    if peaks: line["host_peak_in_steps_gib"] = max(peaks) / 2**30
    if rows[-1].get("bytes_to_device") is not None:
        line["upload_wait_s_median"] = med("upload_wait_s")
        line["h2d_gb_per_step"] = rows[-1]["bytes_to_device"] / 1e9
        line["d2h_gb_per_step"] = rows[-1]["bytes_to_host"] / 1e9
    for k in ("model_tflops", "hardware_tflops"):
        if rows[-1].get(k) is not None: line[k + "_median"] = med(k)
    # GPU busy share over the steady steps, which end when the run does.
    start = float(sys.argv[7]) - sum(r["step_s"] for r in steady)
    util = []
    for l in open(sys.argv[6]):
        f = [x.strip() for x in l.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            if start <= t <= float(sys.argv[7]): util.append(float(f[2]))
        except (ValueError, IndexError):
            pass
    if util: line["gpu_busy_pct_steady"] = statistics.mean(util)
    if rows[-1].get("params"): line["params"] = rows[-1]["params"]
    if rows[-1].get("split"):
        line["split_median_s"] = {k: statistics.median(r["split"][k] for r in steady) for k in rows[-1]["split"]}
        # Achieved copy rates over the steady steps: bytes over the time the
        # copies took on their streams (CUDA events for uploads).
        rate = lambda b, s: (sum(r["split"][b] for r in steady) / sum(r["split"][s] for r in steady) / 1e9
                             if sum(r["split"].get(s, 0) for r in steady) > 0 else None)
        if "forward_h2d_bytes" in rows[-1]["split"]:
            line["h2d_forward_gb_s"] = rate("forward_h2d_bytes", "forward_h2d_copy_s")
            line["h2d_backward_gb_s"] = rate("backward_h2d_bytes", "backward_h2d_copy_s")
            line["d2h_gb_s"] = rate("d2h_bytes", "d2h_copy_s")
print(json.dumps(line))
PY
  rm -f $OUT/$name.gpumem
  pack
}

# `cargo xtask bench cuda` rows (issue 9): `bench_rows <shape> "<k tokens>..."
# "<system>..."` runs every system at every tokens/step on one shape, files
# named bench-<shape>-<N>k-<system>; `cargo xtask bench cuda report` turns them
# into JSON, markdown and a plot. Shapes: 085b (the 0.85B Llama above), 3b.
# Systems: resident burn, the engine pipelined and with serialised copies,
# PyTorch resident (torch-resident, and torch-ckpt with per-block
# checkpointing) and FSDP2 CPU offload (torch-fsdp2). Systems ending in -bf16
# compute in bf16 over fp32 master weights (issue 7): `train --compute bf16`,
# torch_llama.py --dtype bf16.
# BENCH_OLD: also run the rows named in it with the binaries in
# .device/bin-old (an earlier build, for a before/after in the same call).
# GPUS="1 2": every engine row again on each GPU count above 1 (`train --gpus
# N`, data parallel, the tokens per step per GPU), named ...-<system>-x<N>;
# the report adds the scaling efficiency against the one-GPU row.
# An engine row on every GPU count in GPUS (default 1): `engine_rows <name>
# <train args>`; N > 1 is named <name>-x<N> (see bench_rows). PROCESSES="2":
# the row again as that many processes, one GPU each (`train --processes
# N`), named <name>-p<N>.
engine_rows() {
  local name=$1 g at; shift
  for g in ${GPUS:-1}; do
    at=$name; [ $g -gt 1 ] && at=${name%@*}-x$g${name#${name%@*}}
    LIMIT=${LIMIT_ROW:-250} run $at "$@" $( [ $g -gt 1 ] && echo --gpus $g )
  done
  for g in ${PROCESSES:-}; do
    at=${name%@*}-p$g${name#${name%@*}}
    LIMIT=${LIMIT_ROW:-250} run $at "$@" --processes $g
  done
}

# A peer's row (a Python script printing one JSON summary): peer_row NAME
# LIMIT SCRIPT ARGS...; the GPU's memory polled with nvidia-smi throughout.
peer_row() {
  local name=$1 limit=$2; shift 2
  echo "== $name"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $OUT/$name.gpumem &
  local poll=$!
  timeout $limit python3 "$@" > $OUT/$name.torch.json 2> $OUT/$name.err
  echo "exit $?"; kill $poll 2>/dev/null
  sort -n $OUT/$name.gpumem | tail -1 > $OUT/$name.smi; rm -f $OUT/$name.gpumem
  cat $OUT/$name.torch.json; tail -2 $OUT/$name.err; pack
}

bench_rows() {
  local shape=$1 tokens=$2 systems=$3 cfg
  echo '{"arch":"llama","vocab_size":32000,"d_model":3072,"n_layer":28,"n_head":24,"n_kv_head":8,"d_ff":8192,"max_seq_len":2048}' > /tmp/llama-3b.json
  echo '{"arch":"llama","vocab_size":32000,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":32,"d_ff":11008,"max_seq_len":4096}' > /tmp/llama-7b.json
  local host=
  case $shape in
  085b) cfg=/tmp/llama-0.85b.json ;;
  3b) cfg=/tmp/llama-3b.json ;;
  # Llama-2-7B: the lent hosts grow RAM on demand, so HOST_GIB (their
  # documented RAM) goes to the planner as --host-mem-gib.
  7b) cfg=/tmp/llama-7b.json; host=${HOST_GIB:+--host-mem-gib $HOST_GIB} ;;
  *) echo "unknown shape $shape (085b, 3b, 7b)"; exit 2 ;;
  esac
  for b in $tokens; do for sys in $systems; do
    name=bench-$shape-${b}k-$sys
    # With MATMUL, the burn rows again under `--matmul $MATMUL`, named
    # ...-<system>@<kernel> (the report sets them against the default row);
    # PyTorch rows and BENCH_OLD do not depend on it and are skipped.
    # TAG=<label> ARGS="<train flags>" likewise names rows ...-<system>@<label>.
    if [ -n "${MATMUL:-}${TAG:-}" ]; then
      case $sys in torch-*) continue ;; esac
      name=$name@${TAG:-$MATMUL}
    fi
    S="--model $cfg --steps ${BENCH_STEPS:-7} --warmup 1 --lr 3e-4 --seq-len 1024 --batch $b"
    base=${sys%-bf16}; dtype=fp32; [ "$base" != "$sys" ] && dtype=bf16
    S="$S --compute $dtype $host"
    case $base in
    resident)
      # Resident burn keeps every block's activations: above RESIDENT_BATCH
      # sequences (default 16: with attention as one operation, 16 x 1024
      # tokens at 0.85B fp32 fit the 80 GB, 76 GB peak in run20, and ran 5%
      # faster than 4 micro-batches of 4) it accumulates micro-batches of that
      # size, the same tokens per optimizer step.
      # (Its own variable: `R` names the results tarball, which pack() writes.)
      rb=${RESIDENT_BATCH:-16}; rargs=$S
      [ $b -gt $rb ] && rargs="${S% --batch *} --batch $rb --accum $((b / rb)) --compute $dtype"
      LIMIT=${LIMIT_ROW:-120} run $name $rargs --resident ;;
    pipelined) engine_rows $name $S ;;
    serial) engine_rows $name $S --serial-copies ;;
    # Issue 36, for models that fill the host: exact clipping with one
    # backward in the compact host layout (14 B/param in bf16), with 8-bit
    # Adam state (8), and the fused mode's two backwards (14 in bf16).
    compact) engine_rows $name $S --host-layout compact ;;
    compact8) engine_rows $name $S --host-layout compact --optim-state 8bit ;;
    fused) engine_rows $name $S --fused --host-layout full ;;
    torch-*)
      mode=${base#torch-}; mode=${mode/ckpt/resident-ckpt}; mode=${mode/fsdp2/fsdp2-offload}
      peer_row $name ${LIMIT_ROW:-150} bench/peers/torch_llama.py --config $cfg --mode $mode --dtype $dtype --batch $b --seq-len 1024 --steps ${BENCH_STEPS:-7} ;;
    megatrain)
      # MegaTrain's own engine (bench/peers/megatrain_llama.py, its package
      # in .device/megatrain: bench/peers/megatrain_fetch.sh). Its model
      # build takes minutes at 7B (240-330 s on the H200, run50 calls 4-5),
      # so its limit is LIMIT_PEER (default 900 s), not LIMIT_ROW.
      peer_row $name ${LIMIT_PEER:-900} bench/peers/megatrain_llama.py --config $cfg --batch $b --seq-len 1024 \
        --steps ${BENCH_STEPS:-7} --warmup-steps 2 --lr 3e-4 --dtype $dtype ;;
    *) echo "unknown system $sys (resident, pipelined, serial, compact, compact8, fused, torch-resident, torch-ckpt, torch-fsdp2, megatrain, each with -bf16)"; exit 2 ;;
    esac
    if [[ " ${BENCH_OLD:-} " == *" $sys-${b}k "* ]] && [ -x .device/bin-old/train ]; then
      # Builds before issue 7 have no --compute: fp32 rows only. The earlier
      # build's row is ...-<system>-old[@<label>], under the same MATMUL/ARGS.
      S=${S% --compute fp32}
      old=bench-$shape-${b}k-$sys-old; [ "$name" != "${name%@*}" ] && old=$old@${name#*@}
      B=.device/bin-old/train LIMIT=${LIMIT_ROW:-150} run $old $S $( [ $sys = resident ] && echo --resident ) $( [ $sys = serial ] && echo --serial-copies )
    fi
  done; done
}

for part in "$@"; do case $part in
parity)
# Parity of the engine with plain burn, on CUDA (tolerances in tests/src/lib.rs, the tests in tests/tests/engine_*.rs;
# bf16 against fp32 in tests/tests/precision.rs).
echo "== parity tests on CUDA"
for t in .device/bin/*-tests; do
  timeout 200 $t --test-threads 1 --nocapture >> $OUT/parity.txt 2>&1
done
grep -E "^test |panicked|relative|bf16|test result" $OUT/parity.txt; pack
;;
parity-dp)
# Data parallel on every GPU of the machine: the lanes on distinct GPUs sum
# through NCCL (tests/tests/data_parallel.rs against one GPU).
n=$(nvidia-smi -L | wc -l)
echo "== data-parallel parity on $n GPUs"
BURN_OFFLOAD_TEST_GPUS=$n timeout 300 .device/bin/data_parallel-tests --test-threads 1 --nocapture >> $OUT/parity-dp.txt 2>&1
echo "exit $?" >> $OUT/parity-dp.txt
grep -E "^test |panicked|test result|exit" $OUT/parity-dp.txt; pack
;;
parity-processes)
# Issue 38: N processes, one GPU each (`train --processes N`: NCCL between
# processes) against N lanes of one process (`--gpus N`: NCCL inside it) and
# one GPU on their micro-batches together: 20 steps with clipping, deferred
# and fused, their losses and gradient norms side by side.
n=$(nvidia-smi -L | wc -l)
S="--model /tmp/llama-0.85b.json --steps 20 --warmup 2 --lr 3e-4 --seq-len 1024 --grad-clip 0.5 --sample-tokens 0"
for mode in deferred fused; do
  flag=; [ $mode = fused ] && flag=--fused
  echo "== parity-processes $mode on $n GPUs"
  for how in "processes:--batch 2 --processes $n" "lanes:--batch 2 --gpus $n" "one:--batch $((2 * n))"; do
    timeout 200 $B $S $flag ${how#*:} --metrics $OUT/pp-$mode-${how%%:*}.jsonl > $OUT/pp-$mode-${how%%:*}.out 2>&1
    echo "${how%%:*} exit $?"
  done
  python3 - $OUT/pp-$mode-{processes,lanes,one}.jsonl <<'PY'
import json, sys
runs = [[json.loads(l) for l in open(f) if l.strip()] for f in sys.argv[1:]]
steps = lambda run: [(r["loss"], r.get("grad_norm")) for r in run if "loss" in r]
p, l, o = map(steps, runs)
rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)
print("steps", len(p), len(l), len(o))
print("processes == lanes bit for bit:", p == l)
for name, other in (("lanes", l), ("one GPU", o)):
    if p and other:
        print(f"max relative difference against {name}: loss %.2e, gradient norm %.2e" % (
            max(rel(a[0], b[0]) for a, b in zip(p, other)),
            max(rel(a[1], b[1]) for a, b in zip(p, other) if a[1] and b[1])))
for i, (a, b, c) in enumerate(zip(p, l, o)):
    print(i, a, b, c)
PY
done
pack
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
  TRACE=1 run depth-$L --model /tmp/depth-$L.json --steps 4 --warmup 1 --lr 3e-4 --batch 8 --seq-len 512
done
;;
7b)
# >= 7B with fp32 master weights and fp32 Adam, which cannot be trained
# resident on 80 GB: the Llama-3-8B shape with GPT-2's BPE (vocab 50257) has
# 7.39B parameters. Fused (12 B/param on the host; 16 B/param does not leave
# the 125 GiB host enough headroom). Global-norm clipping at 1.0 and the
# non-finite guard: fused mode then runs the backward twice per step (the
# first pass measures the norm). Without clipping the loss spiked at the end
# of the warm-up (run 6: 8.3 -> 34.4).
M7="--model llama-8b --tokenizer gpt2 --batch 4 --seq-len 1024 --fused"
$B --plan $M7 | tee $OUT/llama7b.plan
TRACE=1 LIMIT=${LIMIT_7B:-450} run llama7b-4k $M7 --steps 12 --warmup 4 --lr 6e-5
;;
largest)
# The largest Llama-3-8B-wide model the planner accepts on this machine (issue
# 36): bf16 compute, fused with the compact host layout (12 B/param; 6 with
# LARGEST_STATE=8bit, 8-bit Adam moments), global-norm clipping at 1.0 and the
# non-finite guard on. LARGEST_LAYERS: the depths to try, largest first;
# HOST_GIB: the machine's documented RAM for the planner (GPU hosts grow RAM on
# demand). A 7B-wide model from random initialisation diverges at the bench's
# lr of 3e-4, so these rows train at 5e-6.
if [ "${LARGEST_STATE:-}" = 8bit ]; then layers=${LARGEST_LAYERS:-96 92 88 84 80 76 72}; else layers=${LARGEST_LAYERS:-48 46 44 42 40 38 36}; fi
for L in $layers; do
  echo '{"arch":"llama","vocab_size":50257,"d_model":4096,"n_layer":'$L',"n_head":32,"n_kv_head":8,"d_ff":14336,"max_seq_len":8192}' > /tmp/largest.json
  ML="--model /tmp/largest.json --tokenizer gpt2 --batch 4 --seq-len 1024 --compute bf16 --fused --host-layout compact ${LARGEST_STATE:+--optim-state $LARGEST_STATE} ${HOST_GIB:+--host-mem-gib $HOST_GIB}"
  $B --plan $ML > $OUT/largest-$L.plan 2>&1
  if grep -q '^fits' $OUT/largest-$L.plan; then
    echo "planner accepts $L layers"; cat $OUT/largest-$L.plan
    LIMIT=${LIMIT_LARGEST:-330} run largest-${L}l${LARGEST_STATE:+-$LARGEST_STATE} $ML --steps ${LARGEST_STEPS:-6} --warmup 2 --lr 5e-6
    break
  fi
done
;;
headmem)
# What the LM head and loss phase reserves on the GPU, by loss chunk and shape
# (the planner's GPU calibration): traced 3-step runs, no clipping.
echo '{"arch":"llama","vocab_size":32000,"d_model":3072,"n_layer":28,"n_head":24,"n_kv_head":8,"d_ff":8192,"max_seq_len":2048}' > /tmp/llama-3b.json
echo '{"arch":"llama","vocab_size":32000,"d_model":1024,"n_layer":12,"n_head":16,"n_kv_head":16,"d_ff":2816,"max_seq_len":1024}' > /tmp/depth-12.json
H="--steps 3 --warmup 1 --lr 1e-4 --fused --no-guard --grad-clip 0"
for c in 1024 2048; do
  TRACE=1 run head-8b-c$c --model llama-8b --tokenizer gpt2 --batch 4 --seq-len 1024 --loss-chunk-tokens $c $H
done
TRACE=1 run head-d1024-c1024 --model /tmp/depth-12.json --batch 8 --seq-len 512 --loss-chunk-tokens 1024 $H
TRACE=1 run head-085b-4k --model /tmp/llama-0.85b.json --batch 4 --seq-len 1024 $H
TRACE=1 run head-085b-16k --model /tmp/llama-0.85b.json --batch 16 --seq-len 1024 $H
TRACE=1 run head-3b-4k --model /tmp/llama-3b.json --batch 4 --seq-len 1024 $H
;;
peers)
# PyTorch on the same 0.85B shape (bench/peers/torch_llama.py), fp32, TF32 off.
echo '{"vocab_size":1000,"d_model":256,"n_layer":2,"n_head":8,"n_kv_head":4,"d_ff":512}' > /tmp/torch-tiny.json
for m in resident fsdp2-offload; do  # smoke: a broken peer fails here in seconds
  timeout 60 python3 bench/peers/torch_llama.py --config /tmp/torch-tiny.json --mode $m --batch 2 --seq-len 64 --steps 3 2>&1 | tail -2
done
for spec in "resident 4" "resident-ckpt 4" "fsdp2-offload 4" "resident-ckpt 16" "fsdp2-offload 16"; do
  set -- $spec
  echo "== torch $1 batch $2"
  timeout ${LIMIT_PEER:-100} python3 bench/peers/torch_llama.py --config /tmp/llama-0.85b.json --mode $1 --batch $2 --seq-len 1024 --steps 7 > $OUT/torch-$1-$2.json 2> $OUT/torch-$1-$2.err
  echo "exit $?"; cat $OUT/torch-$1-$2.json; tail -3 $OUT/torch-$1-$2.err
  pack
done
;;
bench)
# Any selection (what `cargo xtask bench cuda run` asks for): every shape in
# SHAPES at every k tokens/step in BENCH_TOKENS, every system in SYSTEMS.
for shape in ${SHAPES:-085b}; do
  bench_rows $shape "${BENCH_TOKENS:-4 16}" "${SYSTEMS:-resident pipelined serial torch-resident torch-ckpt torch-fsdp2}"
done
;;
bench-gpus-085b|bench-gpus-7b)
# Issue 39, on a machine with several GPUs: the engine on 1 and 2 GPUs
# (GPUS), the tokens per step per GPU; the report adds the scaling
# efficiency. The 0.85B shape in fp32 at 16k and bf16 at 64k; the
# Llama-2-7B shape in bf16 at 64k (compact host layout, as bench-7b).
export GPUS=${GPUS:-1 2}
case $part in
bench-gpus-085b)
  bench_rows 085b "16" "pipelined"
  bench_rows 085b "64" "pipelined-bf16" ;;
bench-gpus-7b) bench_rows 7b "64" "compact-bf16" ;;
esac
;;
bench-085b|bench-085b-peers|bench-3b|bench-3b-peers|bench-64k|bench-bf16|bench-bf16-peers|bench-3b-bf16|bench-7b)
# The matrix the committed results ran, split into parts because a device
# call runs at most 10 minutes; each part is one call on the same machine kind.
# SYSTEMS="pipelined-bf16" runs only those rows, BENCH_TOKENS="64" only that size.
case $part in
bench-085b) shape=085b; tokens="4 16"; systems="resident pipelined serial" ;;
bench-085b-peers) shape=085b; tokens="4 16"; systems="torch-resident torch-ckpt torch-fsdp2" ;;
bench-3b) shape=3b; tokens="4 16"; systems="pipelined serial" ;;
bench-3b-peers) shape=3b; tokens="4 16"; systems="torch-ckpt torch-fsdp2" ;;
bench-64k) shape=085b; tokens="64"; systems="resident pipelined serial torch-ckpt torch-fsdp2" ;;
bench-bf16) shape=085b; tokens="16 64"; systems="resident-bf16 pipelined-bf16 serial-bf16" ;;
bench-bf16-peers) shape=085b; tokens="16 64"; systems="torch-resident-bf16 torch-ckpt-bf16 torch-fsdp2-bf16" ;;
bench-3b-bf16) shape=3b; tokens="16"; systems="pipelined-bf16 serial-bf16 torch-ckpt-bf16 torch-fsdp2-bf16" ;;
bench-7b) shape=7b; tokens="64"; systems="compact-bf16 compact8-bf16 fused-bf16 torch-fsdp2-bf16" ;;
esac
bench_rows $shape "${BENCH_TOKENS:-$tokens}" "${SYSTEMS:-$systems}"
;;
*) echo "unknown part $part (parity, parity-dp, parity-processes, bench-gpus-085b, bench-gpus-7b, pipeline, depth, 7b, largest, headmem, peers, bench, bench-085b, bench-085b-peers, bench-3b, bench-3b-peers, bench-64k, bench-bf16, bench-bf16-peers, bench-3b-bf16, bench-7b)"; exit 2 ;;
esac; done
pack
