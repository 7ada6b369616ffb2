#!/usr/bin/env bash
# run43 call 3 (nvidia-h100-x2), issue 52 part 6: NCCL opened as
# libnccl.so.2 from torch's wheel folder on LD_LIBRARY_PATH, no libnccl.so
# link anywhere (burn-offload/src/cuda/nccl.rs), and processes started by
# torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT read by
# train without rank flags).
# 1. tests/tests/data_parallel.rs on CUDA: two and three lanes (NCCL reduce)
#    against one device.
# 2. train on two GPUs: --gpus 2 (one process, NCCL reduce), --processes 2
#    (NCCL all-reduce across processes), and torchrun --nproc-per-node 2
#    --no-python train (the same, started by torchrun), a tiny Llama, bf16.
# Binaries built at fc7d7d3: .device/dp/data_parallel-tests.xz and
# .device/dp/train.xz.
set -u
mkdir -p .device/x
for f in data_parallel-tests train; do xz -dc .device/dp/$f.xz > .device/x/$f; chmod +x .device/x/$f; done
. bench/gpu/cublas_env.sh
echo "libnccl.so anywhere on the path: $(for d in ${LD_LIBRARY_PATH//:/ }; do ls $d/libnccl.so 2>/dev/null; done)"
timeout 240 .device/x/data_parallel-tests --test-threads 1 > $OUT/data_parallel.txt 2>&1; echo "rc $?" >> $OUT/data_parallel.txt
grep -E "^test |result|rc " $OUT/data_parallel.txt
T=".device/x/train --model llama-tiny --compute bf16 --batch 4 --seq-len 128 --steps 6 --sample-tokens 0"
timeout 60 $T --gpus 2 > $OUT/gpus2.txt 2>&1; echo "rc $?" >> $OUT/gpus2.txt
timeout 90 $T --processes 2 > $OUT/processes2.txt 2>&1; echo "rc $?" >> $OUT/processes2.txt
timeout 90 torchrun --nproc-per-node 2 --no-python $T > $OUT/torchrun.txt 2>&1; echo "rc $?" >> $OUT/torchrun.txt
for f in gpus2 processes2 torchrun; do echo "== $f"; grep -E "^loss|rc |error|rank" $OUT/$f.txt | head -8; done
