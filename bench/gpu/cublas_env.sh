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
