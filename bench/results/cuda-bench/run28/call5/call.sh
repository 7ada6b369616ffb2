#!/usr/bin/env bash
# run28 call 5: fp32 at 16k tokens, final build (f864941) against the session's base (a82e4f9).
set -u
O=$OUT
OUT=$O/ab AB_BUILDS="final base" AB_COMPUTE=fp32 AB_TOKENS=16 AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_LIMIT=70 bash bench/gpu/ab.sh
