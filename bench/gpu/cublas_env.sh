# Sourced by the GPU scripts: puts the directory of PyTorch's libcublas (the
# GPU machine has no CUDA toolkit, only the driver and torch's wheels) on
# LD_LIBRARY_PATH, so that `--matmul cublas` and `gemm_bench --cublas` find it.
# Quiet and harmless where there is none: `--matmul cublas` then says so.
if [ -z "${CUBLAS_DIR:-}" ]; then
  for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    hit=$(find "$sp/nvidia" -name 'libcublas.so*' 2>/dev/null | head -1)
    if [ -n "$hit" ]; then CUBLAS_DIR=$(dirname "$hit"); break; fi
  done
fi
if [ -n "${CUBLAS_DIR:-}" ]; then
  export LD_LIBRARY_PATH="$CUBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "cublas: $CUBLAS_DIR ($(ls "$CUBLAS_DIR" | grep -m1 '^libcublas\.so'))"
fi
# cuDNN (9.x), whose fused attention runs bf16/f16 attention where found:
# torch's wheel ships it as nvidia/cudnn/lib/libcudnn.so.9 with its engine
# libraries beside it; its runtime-compiled engines load libnvrtc, which
# the nvidia/cuda_nvrtc wheel ships. Set HIDE_CUDNN=1 to leave both off
# the path (the CubeCL kernels then run attention).
if [ -z "${HIDE_CUDNN:-}" ]; then
  for lib in 'libcudnn.so.9*' 'libnvrtc.so*'; do
    for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
      hit=$(find "$sp/nvidia" -name "$lib" 2>/dev/null | head -1)
      if [ -n "$hit" ]; then
        export LD_LIBRARY_PATH="$(dirname "$hit")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "${lib%%.*}: $(dirname "$hit")"
        break
      fi
    done
  done
fi
# NCCL, which `train --gpus N` sums gradients with: torch's wheel ships
# libnccl.so.2, which burn-offload opens by that name, so its folder goes
# on LD_LIBRARY_PATH.
if [ -z "${NCCL_DIR:-}" ]; then
  for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    hit=$(find "$sp/nvidia" -name 'libnccl.so.2' 2>/dev/null | head -1)
    if [ -n "$hit" ]; then NCCL_DIR=$(dirname "$hit"); break; fi
  done
fi
if [ -n "${NCCL_DIR:-}" ]; then
  export LD_LIBRARY_PATH="$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "nccl: $NCCL_DIR"
fi
