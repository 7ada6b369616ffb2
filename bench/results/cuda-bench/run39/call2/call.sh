#!/usr/bin/env bash
# run39 call 2 (nvidia-h100-x1), issue 50: training with cuDNN's attention
# beside the peers, 0.85B Llama shape, bf16, batch 1, one sequence a step:
# 1. ours (train, --attention auto: cuDNN) and MegaTrain's own engine
#    (bench/peers/megatrain_llama.py, commit in its line) at 65,536 and
#    131,072 tokens; PyTorch resident + per-block checkpointing at 65,536;
# 2. no slowdown at 1k-token sequences: train --attention auto against
#    --attention cubecl (main's path), 64 sequences of 1,024, bf16;
# 3. the CUDA kernel tests of attention with libcudnn found (EXPECT_CUDNN=1:
#    cuDNN against the reference in bf16 and f16, windows, a head width of
#    96) and hidden (EXPECT_CUDNN=0: the CubeCL kernels give the answers).
# Binaries: bash bench/gpu/attention_binaries.sh; MegaTrain:
# bash bench/peers/megatrain_fetch.sh (both in git-ignored .device/).
set -u
mkdir -p .device/x
for f in .device/att/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
# Call 1 loaded cuDNN 9.14.0 although torch's wheel folder holds 9.19: the
# machine has a system libcudnn.so, which cudarc's first candidate name
# finds. Hiding the library means both: the wheel's folder off the path
# and, in a private mount namespace, /dev/null over each system copy.
ldconfig -p | grep -i cudnn > $OUT/cudnn-libs.txt
(
  export HIDE_CUDNN=1
  . bench/gpu/cublas_env.sh > /dev/null
  libs=$(grep -o '/[^ ]*libcudnn[^ ]*' $OUT/cudnn-libs.txt | sort -u | tr '\n' ' ')
  echo "hidden: $libs" > $OUT/test-hidden.txt
  EXPECT_CUDNN=0 unshare -m sh -c 'for l in '"$libs"'; do mount --bind /dev/null "$l"; done
    timeout 120 .device/x/kernels-tests cudnn_attention --nocapture' >> $OUT/test-hidden.txt 2>&1
  echo "exit $?" >> $OUT/test-hidden.txt
)
tail -3 $OUT/test-hidden.txt
. bench/gpu/cublas_env.sh > $OUT/env.txt
EXPECT_CUDNN=1 timeout 120 .device/x/kernels-tests --nocapture attention > $OUT/test-cudnn.txt 2>&1
echo "exit $?" >> $OUT/test-cudnn.txt
grep -E '^test |attention:|exit|panicked|result' $OUT/test-cudnn.txt | head -20
summary='import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; r=[x for x in r if "tokens_per_s" in x][2:]; print(json.dumps({"system": "ours", "row": sys.argv[2], "tok_s_median": round(statistics.median(x["tokens_per_s"] for x in r)), "steps": len(r)}))'
cfg() { echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$1'}' > /tmp/085b-$1.json; }
ours() { # seq batch attention steps limit
  cfg $1
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/gpu-$1x$2-$3.txt &
  smi=$!
  /usr/bin/time -v timeout $5 .device/x/train --model /tmp/085b-$1.json --steps $4 --warmup 2 --lr 1e-4 --seq-len $1 --batch $2 \
    --compute bf16 --sample-tokens 0 --attention $3 --metrics $OUT/ours-$1x$2-$3.jsonl > $OUT/ours-$1x$2-$3.log 2>&1
  echo "exit $? $(grep -E 'Maximum resident' $OUT/ours-$1x$2-$3.log) GPU peak MiB $(sort -n /tmp/gpu-$1x$2-$3.txt | tail -1)"
  kill $smi
  python3 -c "$summary" $OUT/ours-$1x$2-$3.jsonl "$1x$2 $3" | tee -a $OUT/rows.jsonl
}
ours 65536 1 auto 5 100
ours 131072 1 auto 5 150
for s in 65536 131072; do
  cfg $s
  timeout 200 python3 bench/peers/megatrain_llama.py --config /tmp/085b-$s.json --batch 1 --seq-len $s --steps 4 \
    --warmup-steps 2 --lr 3e-4 --dtype bf16 2> $OUT/megatrain-$s.err | tail -1 | tee -a $OUT/rows.jsonl
done
timeout 100 python3 bench/peers/torch_llama.py --config /tmp/085b-65536.json --mode resident-ckpt --dtype bf16 \
  --batch 1 --seq-len 65536 --steps 5 --warmup-steps 2 2>&1 | tail -1 | tee -a $OUT/rows.jsonl
ours 1024 64 auto 6 60
ours 1024 64 cubecl 6 60
cd $OUT && tar czf results.tgz *.txt *.jsonl *.log *.err 2>/dev/null; ls -la $OUT
