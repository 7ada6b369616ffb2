#!/usr/bin/env bash
# run48 call 2 (nvidia-h200), issue 50: what the CubeCL mma kernels execute.
# call 1's build (.device/att48): the kernels' CUDA source as cubecl
# generates it (CUBECL_DEBUG_LOG), and Nsight Compute at 16k, 32/8 heads of
# 64, bf16: the backward's details and both kernels' SASS with executed
# instruction counts.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
for f in .device/att48/attention_bench.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
. bench/gpu/cublas_env.sh > /dev/null
A="--dtype bf16 --head-dim 64 --heads 32,8 --cases fused"
CUBECL_DEBUG_LOG=/tmp/cubecl.log timeout 60 .device/x/attention_bench --lengths 1024 $A --reps 0 > /dev/null 2>&1
grep -c "" /tmp/cubecl.log
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 200 $NCU --clock-control none --set full --import-source yes -k regex:'mma_kernel' --launch-count 3 \
  -o /tmp/flash-mma .device/x/attention_bench --lengths 16384 $A --reps 0 > $OUT/ncu.log 2>&1
$NCU --import /tmp/flash-mma.ncu-rep --page details > $OUT/details.txt 2>&1
grep -E "^  [a-z_]+kernel|Duration|Registers Per|Achieved Occupancy|Issued Ipc|Local Memory Spilling Requests |Theoretical Occupancy|Compute \(SM\) Throughput|Executed Instructions  " $OUT/details.txt
$NCU --import /tmp/flash-mma.ncu-rep --page source --print-source sass --csv > /tmp/sass.csv 2>&1
ls -la /tmp/sass.csv
cp /tmp/cubecl.log $OUT/cubecl.log; cp /tmp/sass.csv $OUT/sass.csv
cd $OUT && tar czf results.tgz cubecl.log sass.csv details.txt ncu.log && rm -f cubecl.log sass.csv details.txt ncu.log
ls -la
