#!/usr/bin/env bash
# run42 call 1 (nvidia-h100-x1), issue 52: generation speed on the 0.85B
# Llama shape in bf16, chat (its key/value cache) beside transformers'
# generate with its cache, same weights, same GPU, same call: prefill tok/s
# over a 2,048-token prompt and decode tok/s over 256 new tokens, greedy.
# The chat binary: bash bench/gpu/generate.sh build (at 43820a1), carried as
# .device/chat.xz.
set -u
GEN_LIMIT=240 timeout 420 bash bench/gpu/generate.sh
