#!/usr/bin/env bash
# run39 call 1 (nvidia-h100-x1), issue 50: cuDNN's fused attention.
# (The CUDA kernel tests were still building: call 2. cuDNN's own log of
# warnings and errors is kept as cudnn-log.txt.)
# 2. Attention alone, one sequence, bf16, causal: attention_bench ("fused":
#    the CubeCL kernels; "models": cuDNN) beside PyTorch sdpa's flash and
#    cudnn backends, 16k and 64k, heads of 64 (32/8) and 128 (16/4).
# 3. Training, 0.85B, bf16, one 16,384-token sequence a step: train with
#    --attention auto (cuDNN) and cubecl, and PyTorch resident with
#    per-block checkpointing (sdpa).
# Binaries: train and attention_bench of bench/gpu/attention_binaries.sh,
# in .device/att1 (git-ignored).
set -u
mkdir -p .device/x
for f in .device/att1/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
. bench/gpu/cublas_env.sh > $OUT/env.txt
cat $OUT/env.txt
export CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=$OUT/cudnn-log.txt
timeout 100 .device/x/attention_bench --lengths 16384,65536 --dtype bf16 --head-dim 64 --heads 32,8 --cases fused,models --reps 5 2>&1 | tee $OUT/attention.jsonl
timeout 60 .device/x/attention_bench --lengths 16384,65536 --dtype bf16 --head-dim 128 --heads 16,4 --cases models --reps 5 2>&1 | tee -a $OUT/attention.jsonl
for be in flash cudnn; do
  timeout 60 python3 bench/peers/torch_sdpa.py --lengths 16384,65536 --head-dim 64 --heads 32,8 --backend $be | tee -a $OUT/sdpa.jsonl
  timeout 60 python3 bench/peers/torch_sdpa.py --lengths 16384,65536 --head-dim 128 --heads 16,4 --backend $be | tee -a $OUT/sdpa.jsonl
done
s=16384
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/085b.json
for att in auto cubecl; do
  timeout 120 .device/x/train --model /tmp/085b.json --steps 6 --warmup 2 --lr 1e-4 --seq-len $s --batch 1 \
    --compute bf16 --sample-tokens 0 --attention $att --metrics $OUT/train-$att.jsonl > $OUT/train-$att.log 2>&1
  echo "train --attention $att: exit $?"
  python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; r=[x for x in r if 'tokens_per_s' in x][2:]; print(sys.argv[2], 'median tok/s', round(statistics.median(x['tokens_per_s'] for x in r)), 'losses', [round(x.get('loss',0),3) for x in r])" $OUT/train-$att.jsonl $att | tee -a $OUT/train.txt
done
timeout 120 python3 bench/peers/torch_llama.py --config /tmp/085b.json --mode resident-ckpt --dtype bf16 \
  --batch 1 --seq-len $s --steps 6 --warmup-steps 2 2>&1 | tail -1 | tee -a $OUT/train.txt
head -c 300000 $OUT/cudnn-log.txt > $OUT/cudnn-log-head.txt 2>/dev/null; rm -f $OUT/cudnn-log.txt
cd $OUT && tar czf results.tgz *.txt *.jsonl *.log 2>/dev/null; ls -la $OUT
