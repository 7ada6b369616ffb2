#!/usr/bin/env bash
# The host memory `train` needs for the README's sizing table ("When to use
# it"): `--plan` for each published shape in three modes, with a host too
# small for any, so that each prints what it needs. No GPU, nothing
# allocated; the output is bench/results/plan-sizes.txt.
#   bash bench/plan_sizes.sh > bench/results/plan-sizes.txt
set -euo pipefail
cd "$(dirname "$0")/.."
echo "# bash bench/plan_sizes.sh ($(git rev-parse --short HEAD)): host memory train needs, by --plan"
echo "# model | default (fp32 compute and Adam state) | --fused | --compute bf16 --fused --optim-state 8bit"
for model in qwen2.5-0.5b llama-3.2-1b llama-3.2-3b llama-3.1-8b qwen2.5-14b; do
  row="$model"
  for mode in "" "--fused" "--compute bf16 --fused --optim-state 8bit"; do
    # shellcheck disable=SC2086
    needs=$(cargo run -q --release --bin train -- --model $model --plan --host-mem-gib 1 $mode 2>&1 | grep -o 'needs [0-9.]* GiB' | head -1 || true)
    row="$row | ${needs:-fits}"
  done
  echo "$row"
done
