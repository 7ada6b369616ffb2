#!/usr/bin/env bash
# run38 call 1 (nvidia-h100-x1): Nsight Compute on the fused attention
# kernels as submitted for issue 37 (call 6's attention_bench), one 16,384-
# position bf16 sequence, heads of 64: where the forward and the backward
# spend their time (stall reasons, shared-memory and tensor-pipe load,
# occupancy, registers), before changing them.
set -u
mkdir -p .device/x
xz -dc .device/fa/attention_bench.xz > .device/x/attention_bench; chmod +x .device/x/attention_bench
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
echo "ncu: $NCU"
timeout 400 $NCU --clock-control none --set full --import-source no \
  -k regex:'forward_kernel|backward_kernel' --launch-skip 0 --launch-count 3 \
  -o $OUT/flash .device/x/attention_bench --lengths 16384 --dtype bf16 --reps 0 > $OUT/ncu.log 2>&1
echo "rc $?"; tail -5 $OUT/ncu.log
$NCU --import $OUT/flash.ncu-rep --page details > $OUT/details.txt 2>&1
$NCU --import $OUT/flash.ncu-rep --page source --csv --print-source sass > $OUT/sass.csv 2>&1
ls -la $OUT; wc -l $OUT/*.txt $OUT/*.csv
grep -E "Kernel|Duration|Registers|Theoretical Occupancy|Achieved Occupancy|Block Limit|Shared Memory Configuration|Compute \(SM\) Throughput|Memory Throughput|warp cycles|Issued Ipc|L1/TEX Hit|Bank" $OUT/details.txt | head -80
cd $OUT && xz -9 sass.csv 2>/dev/null; ls -la
