# Sourced by long_parts.sh and long_detached.sh: the train binary unpacked,
# PyTorch's libraries on the path, the GPU's name in $S, the model config
# (LONG_MODEL: 1b, the Llama-3.2-1B shape, or 8b, the Llama-3.1-8B shape;
# random init) in .device/long-model.json and a text file of random words
# long enough for one LONG_SEQ-token sequence in .device/long-corpus.txt
# (seeded: the same file every time, so a resumed run finds its data).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/logs .device/x
S=$OUT/summary.txt
[ -x .device/x/train ] || { xz -dc .device/new/train.xz > .device/x/train; chmod +x .device/x/train; }
. bench/gpu/cublas_env.sh > /dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
seq=${LONG_SEQ:?}
case ${LONG_MODEL:?} in
  1b) echo '{"arch":"llama","vocab_size":128256,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":8192,"rope_theta":500000.0,"tie_embeddings":true,"max_seq_len":'$seq'}' ;;
  8b) echo '{"arch":"llama","vocab_size":128256,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":8,"d_ff":14336,"rope_theta":500000.0,"max_seq_len":'$seq'}' ;;
  *) echo "LONG_MODEL is 1b or 8b"; exit 2 ;;
esac > .device/long-model.json
[ -f .device/long-corpus.txt ] || python3 -c "import random; r=random.Random(0); w=[''.join(r.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(r.randint(2,9))) for _ in range(5000)]; print(' '.join(r.choice(w) for _ in range($seq // 6 + 100000)))" > .device/long-corpus.txt
