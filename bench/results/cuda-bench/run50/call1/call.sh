#!/usr/bin/env bash
# run50 call 1 (nvidia-h200), issue 50: the CubeCL mma backward with 32 keys a
# plane (128 a cube, two blocks of 16 sharing every query and output-gradient
# fragment read from shared memory) and the next query tile through cp.async.
# 1. kernels tests on CUDA: fused and windowed comparisons, bf16.
# 2. attention_bench fused, bf16, causal, 32/8 heads of 64, 16k and 64k: this
#    build (.device/att50a) against run48 call 4's (.device/att48c), 2 rounds;
#    sdpa flash.
# 3. Nsight Compute launch statistics and throughput of the kernels at 16k.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
for f in .device/att50a/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
xz -dc .device/att48c/attention_bench.xz > .device/x/attention_bench-prev; chmod +x .device/x/attention_bench-prev
. bench/gpu/cublas_env.sh > /dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for t in fused_attention_matches_the_reference_in_bf16 windowed_attention_matches_the_reference_in_bf16; do
  timeout 100 .device/x/kernels-tests --test-threads 1 --exact $t >> $OUT/kernels.txt 2>&1; echo "rc $? $t" >> $OUT/kernels.txt
done
grep -E "^test |result|rc |panicked|off by" $OUT/kernels.txt | head -20
B="--lengths 16384,65536 --dtype bf16 --head-dim 64 --heads 32,8 --cases fused --reps 5"
for r in 1 2; do
  for b in new prev; do
    x=.device/x/attention_bench-$b; [ $b = new ] && x=.device/x/attention_bench
    echo "== $b round $r" >> $OUT/attention.jsonl; timeout 60 $x $B >> $OUT/attention.jsonl 2>&1
  done
done
grep -E "==|tflops|rror|panic" $OUT/attention.jsonl | sed -E 's/"heads": 32, "kv_heads": 8, "head_dim": 64, "dtype": "bf16", "path": "cubecl", //' | cut -c1-300
timeout 90 python3 bench/peers/torch_sdpa.py --lengths 16384,65536 --backend flash > $OUT/sdpa.jsonl 2>&1
cut -c1-300 $OUT/sdpa.jsonl
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 150 $NCU --clock-control none --section LaunchStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:'mma_kernel' --launch-count 2 \
  .device/x/attention_bench --lengths 16384 --dtype bf16 --head-dim 64 --heads 32,8 --cases fused --reps 0 > $OUT/details.txt 2>&1
grep -E "^  [a-z_]+kernel|Duration|Registers Per|Local Memory|Achieved Occupancy|Theoretical Occupancy|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\)|Shared Memory Configuration Size|Dynamic Shared|Static Shared" $OUT/details.txt
cd $OUT && tar czf results.tgz gpu.txt kernels.txt attention.jsonl sdpa.jsonl details.txt && rm -f gpu.txt details.txt
