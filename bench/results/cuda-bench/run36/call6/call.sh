#!/usr/bin/env bash
# run36 call 6 (nvidia-h100-x1, the machine of call 5): issue 35's 4k row
# again, four more interleaved rounds of plain burn resident and the type
# parameter (the build of call 5), for the spread of the ratio.
set -u
cp .device/ab-procs.tar.xz .device/bin.tar.xz
TP_STEPS=8 TP_ROWS="085b:4:resident 085b:4:host 085b:4:resident 085b:4:host 085b:4:resident 085b:4:host 085b:4:resident 085b:4:host" bash bench/gpu/typeparam.sh 2>&1 | grep -E "^085b" | cut -c1-300
