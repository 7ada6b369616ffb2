#!/usr/bin/env bash
# run33 call 10 (nvidia-h100-x1, train with --param-cache-gib as .device/train15.tar.xz, packed as bin.tar.xz
# for the script): the type parameter's rows (issue 35), 0.85B fp32: plain burn resident, the type
# parameter with the cache the plan sizes (every parameter's copy when they fit: the backward reads
# what the forward paged in) and with the 1 GiB cache of before, interleaved.
cp .device/train15.tar.xz .device/bin.tar.xz
TP_ROWS="085b:4:resident 085b:4:host 085b:4:host1g 085b:4:host 085b:4:host1g 085b:16:resident 085b:16:host 085b:16:host1g" bash bench/gpu/typeparam.sh 2>&1 | grep -E "^085b|offload:" | cut -c1-330
