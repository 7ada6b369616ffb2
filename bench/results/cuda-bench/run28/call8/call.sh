#!/usr/bin/env bash
# run28 call 8: engine and kernels tests at 3aa0be6 (attention::record).
set -u
RESULTS=parity bash bench/gpu/pipeline.sh parity 2>&1 | grep -E "test result|FAIL|panicked"
