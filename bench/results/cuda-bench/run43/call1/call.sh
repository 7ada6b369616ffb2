#!/usr/bin/env bash
# run43 call 1 (nvidia-h100-x1), issue 52: the decode step's attention as one
# CubeCL kernel (ops/attention/decode_cuda.rs).
# 1. tests/tests/kernels.rs on CUDA (the new single-query kernel against its
#    softmax in f32 tensor ops, and every other kernel test).
# 2. Generation on the 0.85B Llama shape in bf16 (bench/gpu/generate.sh):
#    transformers' generate with its cache, chat with the kernel, and chat
#    before it (.device/chat-old.xz, 43820a1), same weights, same GPU, same
#    call. Chat binaries: bash bench/gpu/generate.sh build, carried as
#    .device/chat.xz (at 8e05a0a) and .device/chat-old.xz.
set -u
mkdir -p .device/x
xz -dc .device/kt/kernels-tests.xz > .device/x/kernels-tests; chmod +x .device/x/kernels-tests
(. bench/gpu/cublas_env.sh >/dev/null; timeout 120 .device/x/kernels-tests --test-threads 1 --nocapture > $OUT/kernels.txt 2>&1; echo "rc $?" >> $OUT/kernels.txt)
grep -E "^test |result|rc |keys of|off by" $OUT/kernels.txt
GEN_LIMIT=180 timeout 290 bash bench/gpu/generate.sh
mv $OUT/generate.txt $OUT/generate-new.txt; cp /tmp/generate-work/chat.stdout $OUT/new.stdout
xz -dc .device/chat-old.xz > .device/chat-old; chmod +x .device/chat-old
CHAT=.device/chat-old GEN_REPEAT=2 GEN_LIMIT=120 timeout 160 bash bench/gpu/generate.sh > /dev/null 2>&1
grep -E "chat:|transformers:" $OUT/generate.txt | sed 's/^/old binary, second transformers run: /'
mv $OUT/generate.txt $OUT/generate-old.txt; cp /tmp/generate-work/chat.stdout $OUT/old.stdout
# Greedy replies of the two binaries (bf16: a late token may differ).
cmp $OUT/new.stdout $OUT/old.stdout && echo "replies identical" || echo "replies differ: $(cmp $OUT/new.stdout $OUT/old.stdout | head -1)"
cat $OUT/generate-new.txt
