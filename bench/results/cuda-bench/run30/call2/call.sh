# Device call (nvidia-h100-x1), carry .device/bin.tar.xz .device/kernels: the CUDA test
# binaries at acc5d4a (bash bench/gpu/binaries.sh; and
# cargo test --release --features cuda -p burn-offload-tests --test kernels --no-run, stripped, xz'd).
RESULTS=parity bash bench/gpu/pipeline.sh parity > $OUT/parity-summary.txt 2>&1; tail -30 $OUT/parity-summary.txt
cd .device/kernels && xz -d -k kernels-tests.xz && chmod +x kernels-tests && cd ../.. && . bench/gpu/cublas_env.sh >/dev/null
for i in 1 2 3; do .device/kernels/kernels-tests --test-threads 1 --nocapture > /tmp/k$i.txt 2>&1; echo "kernels run $i: $(grep 'test result' /tmp/k$i.txt)"; grep -E "panicked|FAILED" /tmp/k$i.txt; done 2>&1 | tee $OUT/kernels3.txt
