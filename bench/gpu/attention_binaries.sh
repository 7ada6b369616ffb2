#!/usr/bin/env bash
# Builds what the attention calls run (train, attention_bench and the CUDA
# kernel tests), strips them and xz-compresses them into .device/att
# (git-ignored) for the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --features cuda -p trainer --bin train --bin attention_bench
cargo test --release --features cuda -p burn-offload-tests --test kernels --no-run
rm -rf .device/att && mkdir -p .device/att
cp target/release/train target/release/attention_bench .device/att/
cp "$(ls -t target/release/deps/kernels-* | grep -v '\.d$' | head -1)" .device/att/kernels-tests
strip .device/att/*
xz -T2 .device/att/*
ls -la .device/att
