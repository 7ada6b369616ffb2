#!/usr/bin/env bash
# run39 call 4 (nvidia-h100-x1), issue 50, on the tree with packed-document
# boundaries merged (9eda022 and after): the CUDA test binaries of
# documents (packed windows against each example alone, through plain burn
# and the engine), the engine and attention (EXPECT_CUDNN=1), and a 16k
# training row to set beside call 1's 33,380 tok/s.
# Binaries: bash bench/gpu/attention_binaries.sh, then
#   cargo test --release --features cuda -p burn-offload-tests --test documents --test engine --no-run
# (documents-tests and engine-tests in .device/att too).
set -u
mkdir -p .device/x /tmp/logs
for f in .device/att/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > .device/x/$b; chmod +x .device/x/$b; done
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
. bench/gpu/cublas_env.sh > /dev/null
for t in documents engine; do
  timeout 170 .device/x/$t-tests > /tmp/logs/$t-tests.txt 2>&1
  echo "$t-tests: exit $? $(grep -E '^test result' /tmp/logs/$t-tests.txt)" | tee -a $S
  grep -E 'FAILED|panicked' /tmp/logs/$t-tests.txt | head -5 | tee -a $S
done
EXPECT_CUDNN=1 timeout 150 .device/x/kernels-tests attention > /tmp/logs/kernels-tests.txt 2>&1
echo "kernels-tests attention: exit $? $(grep -E '^test result' /tmp/logs/kernels-tests.txt)" | tee -a $S
s=16384
echo '{"arch":"llama","vocab_size":32000,"d_model":2048,"n_layer":16,"n_head":32,"n_kv_head":8,"d_ff":5632,"max_seq_len":'$s'}' > /tmp/085b.json
timeout 90 .device/x/train --model /tmp/085b.json --steps 6 --warmup 2 --lr 1e-4 --seq-len $s --batch 1 \
  --compute bf16 --sample-tokens 0 --metrics /tmp/logs/train-auto.jsonl > /tmp/logs/train-auto.log 2>&1
echo "train 16k: exit $?" | tee -a $S
python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])]; r=[x for x in r if 'tokens_per_s' in x][2:]; print('median tok/s', round(statistics.median(x['tokens_per_s'] for x in r)), 'losses', [round(x.get('loss',0),3) for x in r])" /tmp/logs/train-auto.jsonl | tee -a $S
cd /tmp/logs && tar czf $OUT/results.tgz . ; ls -la $OUT
