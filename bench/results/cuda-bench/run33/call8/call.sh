#!/usr/bin/env bash
# run33 call 8 (nvidia-h100-x1, the same .device/bin.tar.xz as call 7): pipeline.sh's largest part with
# 8-bit Adam state (84 layers, 18.73B), five steps, with the forward graphs the plan keeps; and whether the machine has DeepSpeed.
python3 -c "import deepspeed" 2>&1 | tail -1
HOST_GIB=125 LARGEST_STATE=8bit LARGEST_LAYERS=84 LARGEST_STEPS=5 RESULTS=largest8 bash bench/gpu/pipeline.sh largest | grep -vE "^\s+[0-9]"
