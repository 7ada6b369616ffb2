#!/usr/bin/env bash
# LoRA fidelity on one GPU, in one device call (about 3 minutes; budget 6):
# our `train --lora-rank` against a PyTorch + transformers + PEFT peer with the
# same recipe on the same batches, and our exports read back by PEFT and
# transformers.
#
#   TRAIN=.device/lora/train OUT=$OUT bash bench/gpu/lora_fidelity.sh
#
# Steps (each prints its exit status and wall time into summary.txt):
#  1. corpus: README.md docs/*.md bench/README.md joined -> train.txt and
#     eval.txt (held out: every 10th block of 12 lines, ~10%); the base's
#     pre-training text is other project text, bench/results/**/README.md
#     (BASE_TEXT=train pre-trains on train.txt instead).
#  2. base: bench/hf/lora_base.py -> /tmp/lora-base (random Llama 256 x 4
#     layers, 8/4 heads, d_ff 688, the fixture tokenizer's 662 tokens,
#     pre-trained BASE_STEPS steps in PyTorch, saved f32).
#  3. ours: LoRA r8 a16 on q,k,v,o, f32 base, --matmul cublas (full f32),
#     --export-peft and --export-hf --merge-lora; then the same with
#     --base-dtype nf4 (--export-peft only: merging is refused with nf4).
#  4. peer: bench/peers/torch_lora.py, the same recipe, TF32 off.
#  5. interop: bench/hf/peft_interop.py: PeftModel(base, our adapters) vs our
#     merged folder (max |logit diff| <= 1e-4), eval losses of base, base +
#     adapters, merged, base + the nf4 run's adapters.
#  6. $OUT/summary.txt and $OUT/results.tgz (small files only).
# Knobs: STEPS (200), WARMUP (20), LR (1e-3), BATCH (8), SEQ (128), SEED (42),
# BASE_STEPS (300), BASE_TEXT (other|train), MATMUL (cublas; `auto` for a CPU
# build), LIMIT (per-command timeout, 90 s; LIMIT_ours and LIMIT_ours_nf4 120 s:
# at most 510 s in all, inside a 600 s call).
set -u
TRAIN=${TRAIN:-.device/lora/train}
OUT=${OUT:?OUT: the folder results go to}
STEPS=${STEPS:-200}
WARMUP=${WARMUP:-20}
LR=${LR:-1e-3}
BATCH=${BATCH:-8}
SEQ=${SEQ:-128}
SEED=${SEED:-42}
BASE_STEPS=${BASE_STEPS:-300}
BASE_TEXT=${BASE_TEXT:-other}
LIMIT=${LIMIT:-90}
LIMIT_ours=${LIMIT_ours:-120}
LIMIT_ours_nf4=${LIMIT_ours_nf4:-120}
MATMUL=${MATMUL:-cublas}
RANK=8
ALPHA=16
TARGETS=q_proj,k_proj,v_proj,o_proj
W=/tmp/lora-fidelity
BASE=/tmp/lora-base
mkdir -p "$OUT"
S=$OUT/summary.txt
: > "$S"
rm -rf "$W" "$BASE" /tmp/ours-peft /tmp/ours-merged /tmp/ours-nf4-peft
mkdir -p "$W/logs" "$W/tokcache"
T0=$(date +%s.%N)

say() { echo "$*" | tee -a "$S"; }
# run NAME CMD...: runs CMD under `timeout $LIMIT`, its output in $W/logs/NAME.log,
# and records its exit status and wall time.
run() {
  local name=$1; shift
  local t0 t1 rc lim
  eval "lim=\${LIMIT_$name:-$LIMIT}"
  t0=$(date +%s.%N)
  timeout "$lim" "$@" > "$W/logs/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
  eval "RC_$name=$rc; SECS_$name=$secs"
  say "step $name: exit $rc, ${secs} s$([ $rc = 124 ] && echo " (timed out after $lim s)")"
  tail -5 "$W/logs/$name.log" | sed 's/^/    /' | tee -a "$S"
  return $rc
}

say "lora_fidelity $(date -u +%FT%TZ) train=$TRAIN steps=$STEPS warmup=$WARMUP lr=$LR batch=$BATCH seq=$SEQ seed=$SEED rank=$RANK alpha=$ALPHA targets=$TARGETS base_steps=$BASE_STEPS base_text=$BASE_TEXT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee -a "$S"
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)' 2>&1 | tee -a "$S"
. bench/gpu/cublas_env.sh > "$W/logs/env.txt" 2>&1
sed 's/^/env: /' "$W/logs/env.txt" | tee -a "$S"
if [ ! -x "$TRAIN" ]; then say "no executable train binary at $TRAIN"; fi

# 1. corpus
python3 - "$W" "$BASE_TEXT" <<'EOF' 2>&1 | tee -a "$S"
import glob, os, sys
w, base_text = sys.argv[1], sys.argv[2]
files = ["README.md"] + sorted(glob.glob("docs/*.md")) + ["bench/README.md"]
text = "".join(open(f, encoding="utf-8").read().rstrip("\n") + "\n\n" for f in files)
lines = text.splitlines(keepends=True)
# Held out: every 10th block of 12 lines (so train and eval share the files'
# mix; the last 10% alone would be the end of bench/README.md, unlike the rest).
blocks = [lines[i:i + 12] for i in range(0, len(lines), 12)]
train = [l for b, block in enumerate(blocks) if b % 10 != 9 for l in block]
held = [l for b, block in enumerate(blocks) if b % 10 == 9 for l in block]
open(f"{w}/train.txt", "w", encoding="utf-8").write("".join(train))
open(f"{w}/eval.txt", "w", encoding="utf-8").write("".join(held))
if base_text == "train":
    pre = "".join(train)
else:
    others = sorted(p for p in glob.glob("bench/results/**/README.md", recursive=True))
    pre = "".join(open(f, encoding="utf-8").read().rstrip("\n") + "\n\n" for f in others)
open(f"{w}/pretrain.txt", "w", encoding="utf-8").write(pre)
print(f"corpus: {files} -> train.txt {sum(map(len, train))} chars ({len(train)} lines), "
      f"eval.txt {sum(map(len, held))} chars ({len(held)} lines, every 10th block of 12); "
      f"pretrain.txt {len(pre)} chars ({base_text})")
EOF

# 2. base
run base python3 bench/hf/lora_base.py --train "$W/pretrain.txt" --out "$BASE" --steps "$BASE_STEPS" --seed 1234

# 3. ours (f32 base, then nf4)
common=(--init-from "$BASE" --data "$W/train.txt" --eval-data "$W/eval.txt" --data-cache "$W/tokcache"
  --lora-rank $RANK --lora-alpha $ALPHA --lora-targets $TARGETS
  --steps "$STEPS" --warmup "$WARMUP" --lr "$LR" --batch "$BATCH" --seq-len "$SEQ" --seed "$SEED"
  --compute fp32 --matmul "$MATMUL" --sample-tokens 0)
run ours "$TRAIN" "${common[@]}" --base-dtype f32 --metrics "$OUT/ours.jsonl" \
  --export-peft /tmp/ours-peft --export-hf /tmp/ours-merged --merge-lora
run ours_nf4 "$TRAIN" "${common[@]}" --base-dtype nf4 --metrics "$OUT/ours-nf4.jsonl" \
  --export-peft /tmp/ours-nf4-peft

# 4. peer
run peer python3 bench/peers/torch_lora.py --base "$BASE" --train "$W/train.txt" --eval "$W/eval.txt" \
  --rank $RANK --alpha $ALPHA --targets $TARGETS --steps "$STEPS" --warmup "$WARMUP" --lr "$LR" \
  --min-lr-ratio 0.1 --weight-decay 0.01 --adam-betas 0.9,0.999 --adam-eps 1e-5 --grad-clip 1.0 \
  --batch "$BATCH" --seq-len "$SEQ" --seed "$SEED" --no-tf32 \
  --check-tokens "$W/tokcache" --save-peft "$W/peer-peft" --out "$OUT/peer.json"

# 5. interop
extra=()
[ -f /tmp/ours-nf4-peft/adapter_config.json ] && extra=(--peft-extra nf4=/tmp/ours-nf4-peft)
run interop python3 bench/hf/peft_interop.py --base "$BASE" --peft /tmp/ours-peft --merged /tmp/ours-merged \
  --eval "$W/eval.txt" --seq-len "$SEQ" --batch "$BATCH" "${extra[@]}" --out "$OUT/interop.json"

# 6. summary
cp "$W/logs/"*.log "$OUT/" 2>/dev/null
cp /tmp/ours-peft/adapter_config.json "$OUT/ours-adapter_config.json" 2>/dev/null
cp "$BASE/config.json" "$OUT/base-config.json" 2>/dev/null
python3 - "$OUT" <<'EOF' 2>&1 | tee -a "$S"
import json, os, sys
out = sys.argv[1]
def last_eval(path):
    loss = None
    try:
        for line in open(path):
            d = json.loads(line)
            if "eval_loss" in d:
                loss = d["eval_loss"]
    except (OSError, ValueError) as e:
        print(f"  {path}: {e}")
    return loss
def train_losses(path):
    try:
        return [json.loads(l)["loss"] for l in open(path) if '"eval_loss"' not in l]
    except (OSError, ValueError):
        return []
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"  {path}: {e}")
        return {}
ours = last_eval(f"{out}/ours.jsonl")
nf4 = last_eval(f"{out}/ours-nf4.jsonl")
peer = load(f"{out}/peer.json")
inter = load(f"{out}/interop.json")
pf = peer.get("final_eval_loss")
def f(x, fmt=".5f"):
    return "n/a" if x is None else format(x, fmt)
print("== summary ==")
print(f"base eval loss (peer, before training):   {f(peer.get('base_eval_loss'))}")
print(f"base eval loss (interop, transformers):   {f(inter.get('base_eval_loss'))}")
print(f"ours final eval loss (f32 base):          {f(ours)}")
print(f"peer final eval loss (torch+peft):        {f(pf)}")
if ours is not None and pf:
    r = ours / pf
    print(f"ratio ours/peer:                          {r:.4f}  ({'PASS' if abs(r - 1) <= 0.02 else 'FAIL'}: within 2%)")
print(f"ours nf4-base final eval loss:            {f(nf4)}")
print(f"base + our adapters (PEFT) eval loss:     {f(inter.get('adapter_eval_loss'))}"
      f"  ({'PASS' if inter.get('checks', {}).get('adapter_below_base') else 'FAIL'}: below base)")
print(f"merged export eval loss (transformers):   {f(inter.get('merged_eval_loss'))}")
print(f"base + nf4 run's adapters eval loss:      {f(inter.get('nf4_eval_loss'))}")
d = inter.get("logits_max_abs_diff")
print(f"interop max |logit diff| adapter/merged:  {f(d, '.3e')}  ({'PASS' if d is not None and d <= 1e-4 else 'FAIL'}: <= 1e-4; max |logit| {f(inter.get('logits_max_abs'), '.2f')})")
print(f"peer tokens match train's token cache:    {peer.get('tokens_match')}")
ol, pl = train_losses(f"{out}/ours.jsonl"), peer.get("train_losses", [])
if ol and pl:
    print(f"first train loss ours/peer (same batch, B=0): {ol[0]:.6f} / {pl[0]:.6f}")
    k = min(len(ol), len(pl))
    tail = max(1, k // 10)
    print(f"mean train loss of the last {tail} steps ours/peer: {sum(ol[k-tail:k])/tail:.5f} / {sum(pl[k-tail:k])/tail:.5f}")
print(f"peer train seconds: {peer.get('train_seconds')}")
EOF
for name in base ours ours_nf4 peer interop; do
  eval "say \"wall $name: \${SECS_$name:-n/a} s (exit \${RC_$name:-n/a})\""
done
grep -hE '^(loss|eval loss|host store|memory plan|matmul|cublas)' "$W/logs/ours.log" "$W/logs/ours_nf4.log" 2>/dev/null | sed 's/^/    /' | tee -a "$S"
T1=$(date +%s.%N)
say "total wall: $(python3 -c "print(f'{$T1 - $T0:.1f}')") s"
cd "$OUT" || exit 1
shopt -s nullglob
files=(summary.txt *.json *.jsonl *.log)
tar czf results.tgz "${files[@]}"
echo "results.tgz: exit $? (${files[*]})"
ls -la "$OUT"
