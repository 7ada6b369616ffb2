#!/usr/bin/env bash
# run41 call 1 (nvidia-h100-x1), issue 51 acceptance 6: behaviour unchanged by
# the trainer's split. Train built before issue 51 (2d83984, run40's binary:
# .device/ab-old.tar.xz) against this tree's (.device/ab-new.tar.xz), rows
# interleaved, two rounds: 0.85B fp32 16 x 1,024 tokens a step, then bf16
# 64 x 1,024 tokens a step (the engine rows).
set -u
AB_BUILDS="new old" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_STEPS=8 AB_TOKENS=16 AB_COMPUTE=fp32 OUT=$OUT/fp32-16k bash bench/gpu/ab.sh
AB_BUILDS="new old" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_STEPS=8 AB_TOKENS=64 AB_COMPUTE=bf16 OUT=$OUT/bf16-64k bash bench/gpu/ab.sh
