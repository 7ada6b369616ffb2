#!/usr/bin/env bash
# run33 call 4 (nvidia-h100-x1, train with the stem placeholders left uncast and at most one block of
# gradients waiting for the host worker under --gpu-mem-gib, as .device/train13.tar.xz): the 7B compact run at --gpu-mem-gib 10 traced (driver's used bytes at every
# mark), then big.sh's budget rows at 10 and 24 GiB.
tar xJf .device/train13.tar.xz -C .device; . bench/gpu/cublas_env.sh >/dev/null
echo '{"arch":"llama","vocab_size":32000,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":32,"d_ff":11008,"max_seq_len":4096}' > /tmp/7b.json
A="--model /tmp/7b.json --steps 2 --warmup 1 --lr 1e-5 --seq-len 1024 --batch 4 --compute bf16 --host-layout compact --gpu-mem-gib 10 --host-mem-gib 125 --sample-tokens 0"
BURN_OFFLOAD_TRACE=1 timeout 150 .device/bin/train $A --metrics $OUT/m-trace.jsonl > $OUT/out-trace.txt 2> $OUT/err-trace.txt; echo "trace exit $?"
grep "head\|forward done\|settled\|block 0 backward" $OUT/err-trace.txt | cut -c60- | head -12
for g in 24:16 10:4; do IFS=: read gib tok <<< "$g"; mkdir -p $OUT/gpu$gib; OUT=$OUT/gpu$gib HOST_GIB=125 BIG_STEPS=5 BIG_LIMIT=150 ARGS="--gpu-mem-gib $gib" BIG_ROWS="7b:$tok:compact" bash bench/gpu/big.sh 2>&1 | grep -E "^7b|error" | cut -c1-400; done
xz $OUT/err-trace.txt
