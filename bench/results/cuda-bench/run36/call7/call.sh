#!/usr/bin/env bash
# run36 call 7 (nvidia-h100-x1): issue 35's acceptance 2 in one call with the
# host optimizer's own norm clipping (.device/ab-clip.tar.xz), set beside the
# build of calls 1-6 (ab-procs, fb345a2, burn-optim's clipping on the
# device). 0.85B fp32: plain burn resident and the type parameter at 4k
# tokens, three interleaved rounds; 16k; the Llama-2-7B shape at 2k tokens
# (fp32 weights and Adam state do not fit the GPU) through the type
# parameter beside the engine (--fused); a CUPTI timeline of the type
# parameter at 4k for its upload rate.
set -u
cp .device/ab-clip.tar.xz .device/bin.tar.xz
TP_STEPS=8 TP_ROWS="085b:4:resident 085b:4:host 085b:4:host:procs 085b:4:resident 085b:4:host 085b:4:host:procs \
085b:4:resident 085b:4:host 085b:4:host:procs 085b:16:resident 085b:16:host 7b:2:host 7b:2:fused" \
  bash bench/gpu/typeparam.sh 2>&1 | grep -E "^(085b|7b)" | cut -c1-420
TL_SYSTEMS=resident TL_TOKENS=4 TL_STEPS=6 TAG=host ARGS=--host-params TL_LIMIT=150 bash bench/gpu/timeline/run.sh 2>&1 | grep -E "^==|^exit|tok/s|h2d|shared_sum" | head -20
cp /tmp/out/typeparam* $OUT/ 2>/dev/null
