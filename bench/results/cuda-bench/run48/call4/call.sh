#!/usr/bin/env bash
# run48 call 4 (nvidia-h200), issue 50: the CubeCL backward's dq atomics
# as 8-byte pairs (call 3's Nsight Compute: the backward bound by L2 at 78%,
# its atomics using 8 of each sector's 32 bytes); a quad's four pairs now
# fill a sector.
# 1. kernels tests on CUDA: fused and windowed comparisons, bf16.
# 2. attention_bench fused, bf16, causal, 32/8 heads of 64, 16k and 64k: this
#    build (.device/att48c), call 3's (.device/att48b), main (57b2ac9), 2 rounds;
#    sdpa flash.
# 3. Nsight Compute on this build's kernels at 16k: details and SASS counts.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
for f in .device/att48c/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
xz -dc .device/att48b/attention_bench.xz > .device/x/attention_bench-prev; chmod +x .device/x/attention_bench-prev
xz -dc .device/attbase/attention_bench.xz > .device/x/attention_bench-main; chmod +x .device/x/attention_bench-main
. bench/gpu/cublas_env.sh > /dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for t in fused_attention_matches_the_reference_in_bf16 windowed_attention_matches_the_reference_in_bf16; do
  timeout 100 .device/x/kernels-tests --test-threads 1 --exact $t >> $OUT/kernels.txt 2>&1; echo "rc $? $t" >> $OUT/kernels.txt
done
grep -E "^test |result|rc |panicked|off by" $OUT/kernels.txt | head -20
B="--lengths 16384,65536 --dtype bf16 --head-dim 64 --heads 32,8 --cases fused --reps 5"
for r in 1 2; do
  for b in new prev main; do
    x=.device/x/attention_bench-$b; [ $b = new ] && x=.device/x/attention_bench
    echo "== $b round $r" >> $OUT/attention.jsonl; timeout 60 $x $B >> $OUT/attention.jsonl 2>&1
  done
done
grep -E "==|tflops" $OUT/attention.jsonl | sed -E 's/"heads": 32, "kv_heads": 8, "head_dim": 64, "dtype": "bf16", "path": "cubecl", //'
timeout 90 python3 bench/peers/torch_sdpa.py --lengths 16384,65536 --backend flash > $OUT/sdpa.jsonl 2>&1
cut -c1-300 $OUT/sdpa.jsonl
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 200 $NCU --clock-control none --set full --import-source yes -k regex:'mma_kernel' --launch-count 3 \
  -o /tmp/flash-mma .device/x/attention_bench --lengths 16384 --dtype bf16 --head-dim 64 --heads 32,8 --cases fused --reps 0 > $OUT/ncu.log 2>&1
$NCU --import /tmp/flash-mma.ncu-rep --page details > $OUT/details.txt 2>&1
grep -E "^  [a-z_]+kernel|Duration|Registers Per|Issued Ipc|Local Memory Spilling Requests |Executed Instructions  |L2 Cache Throughput|L1/TEX Cache Throughput" $OUT/details.txt
$NCU --import /tmp/flash-mma.ncu-rep --page source --print-source sass --csv > $OUT/sass.csv 2>&1
cd $OUT && tar czf results.tgz gpu.txt kernels.txt attention.jsonl sdpa.jsonl ncu.log details.txt sass.csv && rm -f gpu.txt ncu.log details.txt sass.csv
