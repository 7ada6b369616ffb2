#!/usr/bin/env bash
# run36 call 4 (nvidia-h100-x1): issue 35's 4k row. The resident loop of
# `train --resident` reads each micro-batch's loss after launching its
# backward (.device/ab-loop.tar.xz) instead of before (ab-procs, fb345a2):
# plain burn (resident) and the type parameter (host: --host-params) with
# each build, interleaved, two rounds, 0.85B fp32 at 4k tokens a step; then
# the 16k rows with the new loop.
set -u
TP_STEPS=10 TP_ROWS="085b:4:resident:procs 085b:4:host:procs 085b:4:resident:loop 085b:4:host:loop \
085b:4:resident:procs 085b:4:host:procs 085b:4:resident:loop 085b:4:host:loop \
085b:16:resident:loop 085b:16:host:loop" bash bench/gpu/typeparam.sh 2>&1 | grep -E "^085b|offload:" | cut -c1-400
