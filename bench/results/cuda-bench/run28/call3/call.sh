#!/usr/bin/env bash
# run28 call 3: GPU parity of the final build; issue 7's rows on one machine.
set -u
O=$OUT
RESULTS=parity OUT=$O bash bench/gpu/pipeline.sh parity 2>&1 | grep -E "test result|FAIL|panicked" 
export OUT=$O
BENCH_TOKENS=64 SYSTEMS="pipelined-bf16" LIMIT_ROW=90 bash bench/gpu/pipeline.sh bench-bf16 | grep -E "==|exit|tok_s" | cut -c1-300
BENCH_TOKENS=64 SYSTEMS="torch-fsdp2-bf16" LIMIT_ROW=100 bash bench/gpu/pipeline.sh bench-bf16-peers | grep -E "==|exit|tok" | cut -c1-300
RESIDENT_BATCH=8 BENCH_TOKENS=64 SYSTEMS="resident-bf16" LIMIT_ROW=150 bash bench/gpu/pipeline.sh bench-bf16 | grep -E "==|exit|tok_s" | cut -c1-300
TAG=rep BENCH_TOKENS=64 SYSTEMS="pipelined-bf16" LIMIT_ROW=90 bash bench/gpu/pipeline.sh bench-bf16 | grep -E "==|exit|tok_s" | cut -c1-300
ls $O
