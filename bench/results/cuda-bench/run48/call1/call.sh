#!/usr/bin/env bash
# run48 call 1 (nvidia-h200), issue 50, the CubeCL fallback's mma kernels:
# the backward walks each query tile 16 queries at a time (only a slice's
# scores in registers), the forward holds two 16-row blocks a plane for heads
# of 64 (BURN_OFFLOAD_FORWARD_BLOCKS=1 runs one, as main).
# 1. tests/tests/kernels.rs on CUDA: the fused and windowed comparisons, bf16.
# 2. attention_bench fused, bf16, causal, 32/8 heads of 64, 16k and 64k:
#    this build with 2 and 1 forward blocks, main (57b2ac9), and sdpa flash.
# 3. Nsight Compute on this build's kernels at 16k.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/x
for f in .device/att48/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
xz -dc .device/attbase/attention_bench.xz > .device/x/attention_bench-main; chmod +x .device/x/attention_bench-main
. bench/gpu/cublas_env.sh > /dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for t in fused_attention_matches_the_reference_in_bf16 windowed_attention_matches_the_reference_in_bf16; do
  timeout 100 .device/x/kernels-tests --test-threads 1 --exact $t >> $OUT/kernels.txt 2>&1; echo "rc $? $t" >> $OUT/kernels.txt
done
grep -E "^test |result|rc |panicked|off by" $OUT/kernels.txt | head -20
B="--lengths 16384,65536 --dtype bf16 --head-dim 64 --heads 32,8 --cases fused --reps 5"
for r in 1 2; do
  echo "== new blocks=2 round $r" >> $OUT/attention.jsonl; timeout 60 .device/x/attention_bench $B >> $OUT/attention.jsonl 2>&1
  echo "== new blocks=1 round $r" >> $OUT/attention.jsonl; BURN_OFFLOAD_FORWARD_BLOCKS=1 timeout 60 .device/x/attention_bench $B >> $OUT/attention.jsonl 2>&1
  echo "== main round $r" >> $OUT/attention.jsonl; timeout 60 .device/x/attention_bench-main $B >> $OUT/attention.jsonl 2>&1
done
grep -E "==|tflops|TFLOPS" $OUT/attention.jsonl | cut -c1-220
timeout 90 python3 bench/peers/torch_sdpa.py --lengths 16384,65536 --backend flash > $OUT/sdpa.jsonl 2>&1
cat $OUT/sdpa.jsonl | cut -c1-220
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 150 $NCU --clock-control none --set full --import-source no -k regex:'mma_kernel' --launch-count 2 \
  -o /tmp/flash-mma .device/x/attention_bench --lengths 16384 --dtype bf16 --head-dim 64 --heads 32,8 --cases fused --reps 0 > $OUT/ncu.log 2>&1
$NCU --import /tmp/flash-mma.ncu-rep --page details > $OUT/details.txt 2>&1
grep -E "^  [a-z_]+kernel|Duration|Registers Per|Achieved Occupancy|Issued Ipc|Local Memory Spilling Requests |Theoretical Occupancy|Shared Memory Configuration Size|Compute \(SM\) Throughput|Memory Throughput" $OUT/details.txt
cd $OUT && tar czf results.tgz gpu.txt kernels.txt attention.jsonl sdpa.jsonl ncu.log details.txt && rm -f gpu.txt ncu.log details.txt
