#!/usr/bin/env bash
# run49 call 5 (nvidia-h200), issue 55: where the type parameter's step goes
# with every block recomputed, 0.85B fp32 at 4k tokens a step: the resident
# loop's phase split (BURN_OFFLOAD_RESIDENT_SPLIT=1: forward, backward,
# optimizer, each ended by a device sync), --block-recompute on and off.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin
xz -dc .device/train49b/train.xz > .device/bin/train; chmod +x .device/bin/train
for mode in on off; do
  BURN_OFFLOAD_RESIDENT_SPLIT=1 ARGS="--block-recompute $mode" TP_ROWS="085b:4:host" TP_STEPS=5 TP_LIMIT=100 bash bench/gpu/typeparam.sh
  tar xzf $OUT/typeparam-logs.tgz -C /tmp ./085b-4k-host.jsonl && mv /tmp/085b-4k-host.jsonl $OUT/split-$mode.jsonl
done
python3 - $OUT <<'PY' | tee $OUT/split.txt
import json, sys
for mode in ["on", "off"]:
    for l in open(f"{sys.argv[1]}/split-{mode}.jsonl"):
        r = json.loads(l)
        if r.get("split"):
            print(mode, "step", round(r["step_s"], 3), {k: round(v, 3) for k, v in r["split"].items() if isinstance(v, (int, float))})
PY
rm -f $OUT/typeparam-logs.tgz
