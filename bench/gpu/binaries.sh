#!/usr/bin/env bash
# Builds the CUDA release binaries the GPU scripts run (train and the engine,
# data-parallel
# and bf16 parity tests), strips them and packs them into .device/bin.tar.xz (git-ignored)
# for the device tool's `carry` (64 MiB per call; xz brings ~80 MB to ~20 MB).
set -euo pipefail
cd "$(dirname "$0")/../.."
# The package with the train binary; `cargo xtask bench cuda build` passes its
# own constant, and a test in xtask keeps this default equal to it.
PKG=${TRAIN_PACKAGE:-trainer}
cargo build --release --features cuda -p "$PKG" --bin train
cargo build --release --features cuda -p "$PKG" --bin gemm_bench
cargo test --release --features cuda -p burn-offload-tests --test engine_gradients --test engine_training --test engine_failures --test init --test precision --test gemm --test eight_bit --test data_parallel --no-run
rm -rf .device/bin && mkdir -p .device/bin
cp target/release/train .device/bin/train
for t in engine_gradients engine_training engine_failures init precision gemm eight_bit data_parallel; do
  exe=$(ls -t target/release/deps/$t-* | grep -v '\.d$' | head -1)
  cp "$exe" .device/bin/$t-tests
done
strip .device/bin/*
tar cJf .device/bin.tar.xz -C .device bin
# gemm_bench travels on its own (bench/gpu/gemm.sh).
mkdir -p .device/gemm && cp target/release/gemm_bench .device/gemm/ && strip .device/gemm/gemm_bench
xz -f .device/gemm/gemm_bench
ls -la .device/bin .device/bin.tar.xz .device/gemm
