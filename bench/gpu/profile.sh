#!/usr/bin/env bash
# Where the GPU time of one training step goes, per kernel (Nsight Compute's
# gpu__time_duration for every launch; kernels serialise under ncu, so this is
# a split of device time, not a step time). A 2-layer model of the 0.85B
# width (the blocks are those of the 16-layer bench shape), 16k tokens, one
# step per compute dtype and system (PROFILE_SYSTEMS: `engine`, the offload
# engine, and/or `resident`, plain burn with the whole model under Autodiff).
# Output: $OUT/profile.tgz (ncu-<dtype>[-resident].csv and .err); aggregate
# with python3 bench/gpu/ncu_summary.py ncu-*.csv.
set -u
if [ -f .device/bin.tar.xz ]; then rm -rf .device/bin; tar xJf .device/bin.tar.xz -C .device; fi
B=.device/bin/train
FINAL=${OUT:-/tmp/out}; OUT=/tmp/profile-work; mkdir -p "$FINAL" $OUT
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":2,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":2048}' > /tmp/prof.json
for dtype in ${PROFILE_DTYPES:-bf16 fp32}; do
for sys in ${PROFILE_SYSTEMS:-engine}; do
  name=ncu-$dtype; extra=
  [ $sys = resident ] && { name=$name-resident; extra=--resident; }
  echo "== ncu, $dtype, $sys"
  timeout ${LIMIT_PROFILE:-150} $NCU --metrics gpu__time_duration.sum --csv --print-units base \
    --clock-control none --cache-control none --launch-count ${PROFILE_LAUNCHES:-2500} \
    $B --model /tmp/prof.json --steps 1 --warmup 0 --lr 3e-4 --batch ${PROFILE_BATCH:-16} --seq-len 1024 \
    --compute $dtype $extra > $OUT/$name.csv 2> $OUT/$name.err
  echo "exit $?"; tail -3 $OUT/$name.err; wc -l $OUT/$name.csv
done
done
tar czf $FINAL/profile.tgz -C $OUT .
