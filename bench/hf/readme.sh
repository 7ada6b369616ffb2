#!/usr/bin/env bash
# The README's Python command (step 4 of "Fine-tune a Hugging Face
# checkpoint"), as the README writes it, on an export made first: the
# README's fine-tune on the tiny test checkpoint (tests/fixtures/families/llama3,
# Llama 3's chat template and a 662-token tokenizer) with the alpaca sample,
# exported to runs/llama-1b-chat (git-ignored). Then the transformers check of
# that export: the assistant-token loss against the original's.
# The train crate's tests/readme.rs finds the README's command here. Run from anywhere,
# with torch and transformers (CPU is enough):
#   bash bench/hf/readme.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
# The train crate's folder: examples/train (trainer before the move).
for DATA in examples/train/data/alpaca-tiny.json; do
  [ -f "$DATA" ] && break
done
cargo run --release --bin train -- --init-from tests/fixtures/families/llama3 --data "$DATA" \
    --seq-len 64 --batch 4 --steps 60 --lr 3e-3 --warmup 5 --sample-tokens 0 \
    --export-hf runs/llama-1b-chat --overwrite
python3 bench/hf/generate.py runs/llama-1b-chat "Add the two numbers: 2 and 3."
python3 tests/fixtures/check_finetune.py runs/llama-1b-chat tests/fixtures/families/llama3 "$DATA"
