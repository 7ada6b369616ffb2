#!/usr/bin/env bash
# run29 call 1: the engine, gemm, init and precision tests on CUDA (H100), built at 70fc283
# (the Llama-shaped families, ignored targets); binaries from bench/gpu/binaries.sh.
set -u
RESULTS=parity bash bench/gpu/pipeline.sh parity 2>&1 | grep -E "^test |test result|FAIL|panicked|relative" | tail -60
