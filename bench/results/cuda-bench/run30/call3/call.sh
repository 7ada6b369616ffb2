# Device call (nvidia-h100-x1), carry .device/tp.tar.xz: train at the commit after 708371c
# (Offload<B> page-ins through the copy machinery, the host AdamW, the copier's exit fix),
# built with `cargo build --release --features cuda -p trainer --bin train`, stripped, xz'd.
# 0.85B Llama, fp32, 6 steps; resident = plain burn (Autodiff<Gemm<Cuda>> + burn-optim AdamW),
# host = --resident --host-params (Autodiff<Offload<Gemm<Cuda>>> + the host AdamW, the default
# 1 GiB parameter cache), engine = the block-streamed engine.
. bench/gpu/cublas_env.sh >/dev/null; mkdir -p .device/tp && tar xJf .device/tp.tar.xz -C .device/tp
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":2048}' > /tmp/m.json
for tok in 4 16; do for mode in resident host engine; do
  extra=--resident; [ $mode = host ] && extra="--resident --host-params"; [ $mode = engine ] && extra=
  /usr/bin/time -v timeout 200 .device/tp/bin/train --model /tmp/m.json --steps 6 --warmup 1 --lr 3e-4 --seq-len 1024 \
    --batch $tok --compute fp32 $extra --sample-tokens 0 --metrics /tmp/$mode-$tok.jsonl > /tmp/$mode-$tok.log 2> /tmp/$mode-$tok.err
  # then: exit status, peak RSS, and the median tok/s of steps 3-6 into $OUT/tp.txt
done; done
