#!/usr/bin/env bash
# run38 call 2 (nvidia-h100-x1): the fused kernels after call 1's profile
# (an unchecked launch with the strides read once, the dq atomic adds
# unrolled, independent product chains interleaved, the score walks rotated
# across banks), "new", against call 6 of run37's kernels, "old":
# 1. tests/tests/kernels.rs on CUDA with the new kernels;
# 2. attention alone (attention_bench --lengths: fused, models, tiles), bf16,
#    heads of 64 (1k-64k) and 128 (16k), old and new side by side;
# 3. Nsight Compute on the new kernels at 16k (as call 1);
# 4. A/B of train, 0.85B, bf16, one 16,384-token sequence a step: the new
#    build (fast1, routing unchanged) against main (procs, fb345a2), two
#    interleaved rounds.
set -u
. bench/gpu/cublas_env.sh > /dev/null
mkdir -p .device/x
for f in kernels-tests attention_bench; do xz -dc .device/fa2/$f.xz > .device/x/$f-new; chmod +x .device/x/$f-new; done
xz -dc .device/fa/attention_bench.xz > .device/x/attention_bench-old; chmod +x .device/x/attention_bench-old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 240 .device/x/kernels-tests-new --test-threads 1 --nocapture attention > $OUT/kernels.txt 2>&1; echo "rc $?" >> $OUT/kernels.txt
grep -E "^test |result|rc |off by|panicked" $OUT/kernels.txt
for b in new old; do
  timeout 200 .device/x/attention_bench-$b --lengths 1024,4096,16384,65536 --dtype bf16 --reps 5 > $OUT/attention-$b.jsonl 2>&1
  timeout 90 .device/x/attention_bench-$b --lengths 16384 --dtype bf16 --head-dim 128 --reps 5 >> $OUT/attention-$b.jsonl 2>&1
done
paste -d' ' <(grep -o '"case": "[^"]*", "seq": [0-9]*, "head_dim": [0-9]*' $OUT/attention-new.jsonl) <(grep -o '"ms": [0-9.]*' $OUT/attention-new.jsonl) <(grep -o '"ms": [0-9.]*' $OUT/attention-old.jsonl)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 200 $NCU --clock-control none --set full --import-source no \
  -k regex:'forward_kernel|backward_kernel' --launch-count 3 \
  -o /tmp/flash-new .device/x/attention_bench-new --lengths 16384 --dtype bf16 --reps 0 > $OUT/ncu.log 2>&1
$NCU --import /tmp/flash-new.ncu-rep --page details > $OUT/details.txt 2>&1
$NCU --import /tmp/flash-new.ncu-rep --page source --csv --print-source sass 2>/dev/null | xz -9 > $OUT/sass.csv.xz
grep -E "^  [a-z_]+kernel|Duration|Registers Per|Achieved Occupancy|Issued Ipc" $OUT/details.txt
AB_SEQ=16384 AB_TOKENS=1 AB_COMPUTE=bf16 AB_SYSTEMS=pipelined AB_BUILDS="fast1 procs" AB_ROUNDS=2 AB_STEPS=6 bash bench/gpu/ab.sh > /dev/null 2>&1
cat $OUT/ab.txt
# 5. The families' parity fixtures again, Mistral's window now 8 positions
#    (shorter than the 24 inputs): tests/fixtures/families.py, on the CPU.
python3 tests/fixtures/families.py --out /tmp/fx > $OUT/families.txt 2>&1; echo "rc $?" >> $OUT/families.txt
tail -12 $OUT/families.txt
tar -C /tmp/fx -cf $OUT/families.tar .
# At most 8 files come back.
cd $OUT && tar czf results.tgz gpu.txt kernels.txt attention-new.jsonl attention-old.jsonl ncu.log details.txt ab.txt families.txt && rm gpu.txt kernels.txt attention-new.jsonl attention-old.jsonl ncu.log details.txt families.txt
ls -la $OUT
