#!/usr/bin/env bash
# run28 call 7: the kernels tests after the review commit (one plane-per-row launch shape in cuda.rs).
set -u
RESULTS=parity bash bench/gpu/pipeline.sh parity 2>&1 | tail -16
