#!/usr/bin/env bash
# Copies MegaTrain's Python package `infinity` (and its LICENSE) out of the
# mirror of github.com/DLYuanGod/MegaTrain into .device/megatrain (git-ignored),
# for bench/peers/megatrain_llama.py (`--megatrain-dir`, that folder by default).
# Nothing is built: the engine (infinity.model.cpu_master.CPUMasterModel) is
# pure PyTorch. The committed aarch64 .so files, build folders and __pycache__
# stay out. The device tool's `run` does not send ignored paths unless asked:
# pass carry [".device/megatrain"].
#
#   bench/peers/megatrain_fetch.sh [MIRROR_GIT_DIR] [COMMIT]
set -euo pipefail
cd "$(dirname "$0")/../.."
MIRROR=${1:-${MEGATRAIN_MIRROR:-/work/.mirror/DLYuanGod+MegaTrain/repo}}
COMMIT=${2:-HEAD}
DEST=.device/megatrain
rev=$(git -C "$MIRROR" rev-parse "$COMMIT^{commit}")
rm -rf "$DEST" && mkdir -p "$DEST"
# Archive the subtree alone: the mirror lacks some blobs of the root tree (the
# committed csrc/build binaries), which a path-limited archive of the root
# reports as errors.
git -C "$MIRROR" archive --format=tar --prefix=infinity/ "$rev:infinity" \
  | tar -x -C "$DEST" \
      --exclude='__pycache__' --exclude='*.pyc' --exclude='*.so' --exclude='*.o' \
      --exclude='infinity/cuda_pipeline/build' --exclude='*.egg-info'
git -C "$MIRROR" show "$rev:LICENSE" > "$DEST/LICENSE"
echo "$rev" > "$DEST/COMMIT"
echo "MegaTrain $rev -> $DEST"
find "$DEST" -type f | wc -l | sed 's/^/files: /'
du -sh "$DEST"
