#!/usr/bin/env bash
# run35 call 6 (nvidia-h100-x1; the build of call 4 as ab-tile, main's as
# ab-dp2): the A/B at the usual bf16 row, 64 sequences of 1024 tokens a step
# (0.85B), where every sequence is one key tile and the f32 sums are new.
set -u
OUT=${OUT:-/tmp/out}
cp .device/mlp.tar.xz .device/ab-tile.tar.xz
AB_BUILDS="tile dp2" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_TOKENS=64 AB_COMPUTE=bf16 AB_STEPS=7 bash bench/gpu/ab.sh
