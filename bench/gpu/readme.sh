#!/usr/bin/env bash
# The README's CUDA commands, as the README writes them: the CUDA build and
# the several-GPU runs. The train crate's tests/readme.rs (CI) runs the README's CPU
# commands itself and finds each of the others as a line here.
#
# On a machine with NVIDIA GPUs and the Rust toolchain, from anywhere:
#   bash bench/gpu/readme.sh            # the build, and a short bf16 run on GPU 0
#   GPUS=2 bash bench/gpu/readme.sh     # and the README's two-GPU runs
# Without a toolchain (a lent GPU machine), TRAIN=<a --features cuda build of
# train> runs the same lines with that binary: `cargo build` is then skipped
# and `cargo run … --bin train -- ARGS` runs "$TRAIN" ARGS.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${TRAIN:-}" ]; then
  cargo() {
    case "$1" in
      build) echo "TRAIN=$TRAIN: not running cargo $*" ;;
      run)
        while [ "$1" != "--" ]; do shift; done
        shift
        echo "+ $TRAIN $*"
        "$TRAIN" "$@"
        ;;
      *) command cargo "$@" ;;
    esac
  }
fi
# cuBLAS, cuDNN and NCCL from PyTorch's wheels, where there is no CUDA toolkit.
. bench/gpu/cublas_env.sh
cargo build --release --features cuda --bin train
# Not a README line: one GPU, the same job as the two-GPU lines below, a few steps.
cargo run --release --features cuda --bin train -- --model llama-3.2-1b --compute bf16 \
    --batch 16 --seq-len 4096 --steps 5
if [ "${GPUS:-1}" -ge 2 ]; then
  cargo run --release --features cuda --bin train -- --model llama-3.2-1b --compute bf16 \
      --batch 16 --seq-len 4096 --steps 20 --gpus 2
  cargo run --release --features cuda --bin train -- --model llama-3.2-1b --compute bf16 \
      --batch 16 --seq-len 4096 --steps 20 --processes 2
fi
