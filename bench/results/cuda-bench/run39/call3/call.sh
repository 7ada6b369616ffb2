#!/usr/bin/env bash
# run39 call 3 (nvidia-h100-x1), issue 50:
# 1. the CUDA kernel test of attention with libcudnn hidden (the wheel's
#    folder off the path and /dev/null over each system copy in a private
#    mount namespace; EXPECT_CUDNN=0: the CubeCL kernels give the answers);
# 2. 262,144 tokens, 0.85B, bf16, batch 1: ours (cuDNN) and MegaTrain's own
#    engine (bench/peers/megatrain_llama.py), 3 steps each.
# Everything comes back in summary.txt and results.tgz (the device tool
# returns at most 8 files).
set -u
mkdir -p .device/x /tmp/logs
for f in .device/att/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
ldconfig -p | grep -i cudnn > /tmp/logs/cudnn-libs.txt
(
  export HIDE_CUDNN=1
  . bench/gpu/cublas_env.sh > /dev/null
  libs=$(grep -o '/[^ ]*libcudnn[^ ]*' /tmp/logs/cudnn-libs.txt | sort -u | tr '\n' ' ')
  EXPECT_CUDNN=0 unshare -m sh -c 'for l in '"$libs"'; do mount --bind /dev/null "$l" || exit 3; done
    timeout 110 .device/x/kernels-tests cudnn_attention --nocapture' > /tmp/logs/test-hidden.txt 2>&1
  echo "hidden-library test: exit $?" >> $S
)
grep -E 'attention:|cuDNN|^test |panicked' /tmp/logs/test-hidden.txt | tee -a $S
. bench/gpu/cublas_env.sh > /dev/null
s=262144
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/085b-$s.json
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/logs/gpu-ours.txt &
smi=$!
/usr/bin/time -v timeout 200 .device/x/train --model /tmp/085b-$s.json --steps 3 --warmup 1 --lr 1e-4 --seq-len $s --batch 1 \
  --compute bf16 --sample-tokens 0 --metrics /tmp/logs/ours-$s.jsonl > /tmp/logs/ours-$s.log 2>&1
echo "ours $s: exit $? $(grep -E 'Maximum resident' /tmp/logs/ours-$s.log) GPU peak MiB $(sort -n /tmp/logs/gpu-ours.txt | tail -1)" | tee -a $S
kill $smi
grep -E '^step|attention:|memory plan|keep their' /tmp/logs/ours-$s.log | tee -a $S
timeout 250 python3 bench/peers/megatrain_llama.py --config /tmp/085b-$s.json --batch 1 --seq-len $s --steps 3 \
  --warmup-steps 1 --lr 3e-4 --dtype bf16 2> /tmp/logs/megatrain-$s.err | tail -1 | tee -a $S
grep -E '^step' /tmp/logs/megatrain-$s.err | tee -a $S
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
