#!/usr/bin/env bash
# run32 call 6 (nvidia-h100-x1): the CUDA parity tests (engine, init, precision, gemm,
# eight_bit; bench/gpu/binaries.sh at 8d5abed).
RESULTS=parity bash bench/gpu/pipeline.sh parity 2>&1 | grep -E "^test |panicked|test result|relative|vs" | head -80
