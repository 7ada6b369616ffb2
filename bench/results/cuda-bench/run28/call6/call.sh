#!/usr/bin/env bash
# run28 call 6: the blocks' updates lent when the step ends (lend) against f864941 (final).
set -u
O=$OUT
OUT=$O/ab AB_BUILDS="lend final" AB_COMPUTE=bf16 AB_TOKENS=64 AB_SYSTEMS=pipelined AB_ROUNDS=3 AB_LIMIT=80 bash bench/gpu/ab.sh
