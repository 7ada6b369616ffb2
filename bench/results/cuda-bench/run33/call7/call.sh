#!/usr/bin/env bash
# run33 call 7 (nvidia-h100-x1, bench/gpu/binaries.sh at d1612cd packed as .device/bin.tar.xz): the CUDA
# parity tests, then pipeline.sh's largest part with fp32 Adam state (bf16 compute, fused + compact,
# clipping and guard on, the plan's kept graphs), and whether the machine has DeepSpeed.
python3 -c "import deepspeed" 2>&1 | tail -1
RESULTS=parity bash bench/gpu/pipeline.sh parity | grep -E "test result|panicked|FAILED"
HOST_GIB=125 RESULTS=largest bash bench/gpu/pipeline.sh largest | grep -vE "^\s+[0-9]"
