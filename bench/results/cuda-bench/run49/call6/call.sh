#!/usr/bin/env bash
# run49 call 6 (nvidia-h200), issue 55: call 4's 0.85B rows again with the
# recomputed blocks' gradients clipped on the host (.device/train49c): call 5
# put the step's optimizer phase at 0.69 s with every block recomputed
# (0.12 s without), the norm clipping paging the host gradients back to the
# GPU. 0.85B fp32, 4k and 16k tokens a step: plain burn resident, the type
# parameter as placed (auto: one graph) and with every block recomputed (on).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin
xz -dc .device/train49c/train.xz > .device/bin/train; chmod +x .device/bin/train
TP_ROWS="085b:4:resident 085b:4:host 085b:16:resident 085b:16:host" TP_STEPS=6 TP_LIMIT=120 bash bench/gpu/typeparam.sh
echo "-- --block-recompute on" >> $OUT/typeparam.txt
BURN_OFFLOAD_RESIDENT_SPLIT=1 ARGS="--block-recompute on" TP_ROWS="085b:4:host 085b:16:host" TP_STEPS=6 TP_LIMIT=120 bash bench/gpu/typeparam.sh
mkdir -p /tmp/on && tar xzf $OUT/typeparam-logs.tgz -C /tmp/on
python3 - <<'PY' | tee -a $OUT/typeparam.txt
import json
for name in ["085b-4k-host", "085b-16k-host"]:
    rows = [json.loads(l) for l in open(f"/tmp/on/{name}.jsonl") if l.strip()]
    for r in rows[2:]:
        s = r.get("split") or {}
        print(name, "on step", round(r["step_s"], 3), {k: round(s[k], 3) for k in ("forward_s", "backward_s", "optimizer_s") if k in s})
PY
rm -f $OUT/typeparam-logs.tgz
