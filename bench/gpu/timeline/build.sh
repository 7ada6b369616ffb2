#!/usr/bin/env bash
# Builds cupti_trace.so on the dev machine (no GPU needed) against the CUPTI
# 13.0 wheel from PyPI (CUDA 13.0 matches the H100's driver 580), and packs it
# with libcupti.so.13 into .device/timeline.tar.xz for the device tool's carry.
set -eu
cd "$(dirname "$0")/../../.."
W=${CUPTI_WORK:-/tmp/cupti}
if [ ! -f $W/nvidia/cu13/include/cupti.h ]; then
  mkdir -p $W
  (cd $W && pip download --no-deps "nvidia-cuda-cupti==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*" \
    && for w in *.whl; do unzip -q -o "$w"; done)
fi
P=/tmp/timeline-pack/timeline; rm -rf $P; mkdir -p $P
gcc -O2 -shared -fPIC -Wall -Wextra -I$W/nvidia/cu13/include bench/gpu/timeline/cupti_trace.c \
  -L$W/nvidia/cu13/lib -l:libcupti.so.13 -Wl,-rpath,'$ORIGIN' -o $P/cupti_trace.so
cp $W/nvidia/cu13/lib/libcupti.so.13 $P/
mkdir -p .device
tar cJf .device/timeline.tar.xz -C /tmp/timeline-pack timeline
ls -la .device/timeline.tar.xz
