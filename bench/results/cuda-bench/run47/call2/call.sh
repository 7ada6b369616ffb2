#!/usr/bin/env bash
# run47 call 2 (nvidia-h200), issue 53:
# 1. A Hugging Face checkpoint of the Llama-3.1-8B shape (random weights,
#    bf16, 4 shards, written by transformers here), fine-tuned with
#    --init-from: LoRA r16 on every projection, NF4 base, --gpu-mem-gib 24,
#    4,096 tokens a step, 4 steps. The store takes the checkpoint's tensors
#    from the files on the host (models::hf::CheckpointValues); the log's
#    "host store ready" line gives the build time.
# 2. call 1's 70B row with an int8 base.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin; xz -dc .device/lora/train.xz > .device/bin/train; chmod +x .device/bin/train
. bench/gpu/cublas_env.sh > /dev/null
LORA="--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --gpu-mem-gib 24"
CK=/tmp/l8b-hf
start=$(date +%s)
python3 - $CK <<'PY' > $OUT/checkpoint.txt 2>&1
import sys, torch, transformers
cfg = transformers.LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=False)
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(sys.argv[1], max_shard_size="5GB")
print("saved", sum(p.numel() for p in model.parameters()))
PY
echo "checkpoint written in $(( $(date +%s) - start )) s: $(tail -1 $OUT/checkpoint.txt); $(ls $CK | tr '\n' ' ')" | tee $OUT/summary.txt
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $OUT/l8b.gpu & smi=$!
/usr/bin/time -v timeout 200 .device/bin/train --init-from $CK --steps 4 --warmup 2 --lr 1e-4 --seq-len 4096 --batch 1 \
  --compute bf16 $LORA --base-dtype nf4 --sample-tokens 0 --metrics $OUT/l8b.jsonl > $OUT/l8b.log 2> $OUT/l8b.err
echo "l8b --init-from exit $? gpu_peak_mib $(sort -n $OUT/l8b.gpu | tail -1)" | tee -a $OUT/summary.txt
kill $smi; wait $smi 2>/dev/null
grep -E "host store ready|memory plan|Maximum resident|Elapsed" $OUT/l8b.err | tee -a $OUT/summary.txt
python3 -c "
import json; rows=[json.loads(l) for l in open('$OUT/l8b.jsonl') if 'step_s' in l]
print('l8b steps', [(r['step'], round(r['loss'],4), round(r['tokens_per_s'])) for r in rows])" | tee -a $OUT/summary.txt
rm -rf $CK
BIG_SEQ=4096 BIG_STEPS=5 BIG_LIMIT=300 BIG_ROWS="l70b:4:auto" ARGS="$LORA --base-dtype int8" bash bench/gpu/big.sh > /dev/null 2>&1
cp /tmp/big-work/*.plan $OUT/plan-int8.txt; tail -1 /tmp/big-work/*.jsonl > $OUT/last-step-int8.json
cat $OUT/big.txt >> $OUT/summary.txt
cat $OUT/summary.txt
