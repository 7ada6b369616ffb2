#!/usr/bin/env bash
# Builds what the attention calls run (train, attention_bench and the CUDA
# tests of the kernels, packed documents and the engine), strips them and xz-compresses them into .device/att
# (git-ignored) for the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --features cuda -p trainer --bin train --bin attention_bench
cargo test --release --features cuda -p burn-offload-tests --test kernels --test documents --test engine_gradients --test engine_training --test engine_failures --no-run
rm -rf .device/att && mkdir -p .device/att
cp target/release/train target/release/attention_bench .device/att/
for t in kernels documents engine_gradients engine_training engine_failures; do
  cp "$(ls -t target/release/deps/$t-* | grep -v '\.d$' | head -1)" .device/att/$t-tests
done
strip .device/att/*
xz -T2 .device/att/*
ls -la .device/att
