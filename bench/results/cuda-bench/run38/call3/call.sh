#!/usr/bin/env bash
# run38 call 3 (nvidia-h100-x1): the 16-bit fused kernels on mma.sync with the
# scores in registers (flash/mma.rs; the backward for heads of at most 64),
# the sliding window in the kernels, and the routing that runs both bf16
# passes fused at every length for heads of 64:
# 1. tests/tests/kernels.rs on CUDA (attention: fused, windowed, tiled);
# 2. attention alone, bf16, heads of 64 (1k-64k) and 128 (16k): this build
#    ("new") beside call 2's ("old", the WMMA kernels), and PyTorch's sdpa
#    (flash backend) on the same shapes;
# 3. Nsight Compute on the new kernels at 16k (details only);
# 4. A/B of train, 0.85B, bf16, one 16,384-token sequence a step: this build
#    (fast2) against main (procs, fb345a2), two interleaved rounds.
set -u
. bench/gpu/cublas_env.sh > /dev/null
mkdir -p .device/x
for f in kernels-tests attention_bench; do xz -dc .device/fa3/$f.xz > .device/x/$f-new; chmod +x .device/x/$f-new; done
xz -dc .device/fa2/attention_bench.xz > .device/x/attention_bench-old; chmod +x .device/x/attention_bench-old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 300 .device/x/kernels-tests-new --test-threads 1 --nocapture attention > $OUT/kernels.txt 2>&1; echo "rc $?" >> $OUT/kernels.txt
grep -E "^test |result|rc |off by|panicked|error" $OUT/kernels.txt | head -30
for b in new old; do
  timeout 150 .device/x/attention_bench-$b --lengths 1024,4096,16384,65536 --dtype bf16 --reps 5 > $OUT/attention-$b.jsonl 2>&1
  timeout 60 .device/x/attention_bench-$b --lengths 16384 --dtype bf16 --head-dim 128 --reps 5 >> $OUT/attention-$b.jsonl 2>&1
done
paste -d' ' <(grep -o '"case": "[^"]*", "seq": [0-9]*, "head_dim": [0-9]*' $OUT/attention-new.jsonl) <(grep -o '"ms": [0-9.]*' $OUT/attention-new.jsonl) <(grep -o '"ms": [0-9.]*' $OUT/attention-old.jsonl)
tail -3 $OUT/attention-new.jsonl
python3 bench/peers/torch_sdpa.py --lengths 1024,4096,16384,65536 --backend flash > $OUT/sdpa.jsonl 2>&1
python3 bench/peers/torch_sdpa.py --lengths 16384 --head-dim 128 --backend flash >> $OUT/sdpa.jsonl 2>&1
cat $OUT/sdpa.jsonl
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 120 $NCU --clock-control none --set full --import-source no \
  -k regex:'mma_kernel' --launch-count 3 \
  -o /tmp/flash-mma .device/x/attention_bench-new --lengths 16384 --dtype bf16 --reps 0 > $OUT/ncu.log 2>&1
$NCU --import /tmp/flash-mma.ncu-rep --page details > $OUT/details.txt 2>&1
grep -E "^  [a-z_]+kernel|Duration|Registers Per|Achieved Occupancy|Issued Ipc|Local Memory Spilling Requests " $OUT/details.txt
AB_SEQ=16384 AB_TOKENS=1 AB_COMPUTE=bf16 AB_SYSTEMS=pipelined AB_BUILDS="fast2 procs" AB_ROUNDS=2 AB_STEPS=6 bash bench/gpu/ab.sh > /dev/null 2>&1
cat $OUT/ab.txt
cd $OUT && tar czf results.tgz gpu.txt kernels.txt attention-new.jsonl attention-old.jsonl sdpa.jsonl ncu.log details.txt ab.txt && rm gpu.txt kernels.txt attention-new.jsonl attention-old.jsonl sdpa.jsonl ncu.log details.txt
ls -la $OUT
