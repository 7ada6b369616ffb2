#!/usr/bin/env bash
# run35 call 4 (nvidia-h100-x1; train and the engine test binary built at the
# MLP-tiles commit, as .device/mlp.tar.xz): the MLP over tiles on CUDA (the
# engine test against plain burn), `--plan` on the CUDA build for the long
# shapes (the longest sequence each fits), and the 0.85B at 65,536 tokens a
# sequence on a 24 GiB GPU budget, where the plan tiles the MLP.
set -u
OUT=${OUT:-/tmp/out}
rm -rf .device/bin && tar xJf .device/mlp.tar.xz -C .device
. bench/gpu/cublas_env.sh >/dev/null
.device/bin/engine-tests --test-threads 1 mlp_tiles > $OUT/engine-mlp.txt 2>&1; echo "engine mlp_tiles exit $?" | tee -a $OUT/engine-mlp.txt
tail -3 $OUT/engine-mlp.txt
W=/tmp/plans; mkdir -p $W
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":1048576}' > $W/085b.json
echo '{"arch":"llama","vocab_size":128256,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":8192,"max_seq_len":1048576}' > $W/l1b.json
echo '{"arch":"llama","vocab_size":128256,"d_model":3072,"n_layer":28,"n_head":24,"n_kv_head":8,"d_ff":8192,"max_seq_len":1048576}' > $W/l3b.json
echo '{"arch":"llama","vocab_size":128256,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":8,"d_ff":14336,"max_seq_len":1048576}' > $W/l8b.json
for m in 085b l1b l3b l8b; do for extra in "" "--optim-state 8bit"; do for gib in 79 24; do
  echo "== $m bf16 --gpu-mem-gib $gib $extra" >> $OUT/plans.txt
  .device/bin/train --plan --model $W/$m.json --seq-len 65536 --batch 1 --compute bf16 --gpu-mem-gib $gib $extra 2>&1 | tail -4 >> $OUT/plans.txt
done; done; done
cat $OUT/plans.txt | grep -E "^==|longest|MLP|fit" | head -60
.device/bin/train --plan --model $W/085b.json --seq-len 65536 --batch 1 --compute bf16 --gpu-mem-gib 24 > $OUT/085b-64k-24g.plan 2>&1
BIG_SEQ=65536 BIG_STEPS=4 BIG_LIMIT=240 ARGS="--gpu-mem-gib 24" BIG_ROWS="085b:64:auto" bash bench/gpu/big.sh
