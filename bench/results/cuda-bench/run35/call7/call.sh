#!/usr/bin/env bash
# run35 call 7 (nvidia-h100-x1; train at the commit that keeps short gradient
# sums in the compute dtype, as ab-tile2; main's as ab-dp2): the A/B of
# call 6 again, 0.85B bf16, 64 sequences of 1024 tokens a step, and at one
# 16k sequence.
set -u
OUT=${OUT:-/tmp/out}
AB_BUILDS="tile2 dp2" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_TOKENS=64 AB_COMPUTE=bf16 AB_STEPS=7 bash bench/gpu/ab.sh
mv $OUT/ab.txt $OUT/ab-64x1k.txt; mv $OUT/ab.tgz $OUT/ab-64x1k.tgz
AB_BUILDS="tile2 dp2" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_SEQ=16384 AB_TOKENS=1 AB_COMPUTE=bf16 AB_STEPS=6 AB_LIMIT=120 bash bench/gpu/ab.sh
