#!/usr/bin/env bash
# Matmul throughput per cubek strategy (examples/train/src/bin/gemm_bench.rs) beside
# cuBLAS through PyTorch (bench/gpu/torch_gemm.py) and through burn-offload's
# fenced `--matmul cublas` path, on the 0.85B block's shapes.
# Carry .device/gemm (the stripped, xz-packed gemm_bench: cargo build --release
# --features cuda -p trainer --bin gemm_bench). Output: $OUT/gemm.jsonl.
# STRATEGIES=auto,matmul_simple_tma_mma times only those cubek strategies.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
xz -dkf .device/gemm/gemm_bench.xz
chmod +x .device/gemm/gemm_bench
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. bench/gpu/cublas_env.sh
timeout 60 python3 bench/gpu/torch_gemm.py | tee $OUT/gemm.jsonl
timeout ${LIMIT_BF16:-100} .device/gemm/gemm_bench --cublas ${STRATEGIES:+--strategies $STRATEGIES} --dtypes bf16 --budget-s ${BUDGET_BF16:-85} | tee -a $OUT/gemm.jsonl
timeout ${LIMIT_F32:-50} .device/gemm/gemm_bench --cublas ${STRATEGIES:+--strategies $STRATEGIES} --dtypes f32 --budget-s ${BUDGET_F32:-35} | tee -a $OUT/gemm.jsonl
