#!/usr/bin/env bash
# run36 call 3 (nvidia-h100-x2, the machine of calls 1-2): issue 38's
# acceptance 2 for this stop's engine changes. One GPU's rows, this build
# (.device/ab-procs.tar.xz) against the build before them (ab-tile2: 7508cd1,
# the engine of run35's last calls), two interleaved rounds: 0.85B fp32 at
# 16k tokens, bf16 at 64k.
set -u
mkdir -p $OUT/fp32 $OUT/bf16
OUT=$OUT/fp32 AB_BUILDS="procs tile2" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_TOKENS=16 bash bench/gpu/ab.sh 2>&1 | grep -E "^pipelined" | cut -c1-200
OUT=$OUT/bf16 AB_BUILDS="procs tile2" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_TOKENS=64 AB_COMPUTE=bf16 bash bench/gpu/ab.sh 2>&1 | grep -E "^pipelined" | cut -c1-200
