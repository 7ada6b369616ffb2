# Device call (ran on an NVIDIA H200), carry .device/det.tar.xz: a throwaway test binary (not committed)
# that trains the tiny Llama on plain burn twice from the same weights with burn-optim AdamW and norm
# clipping at 0.5, side by side (tests/src/lib.rs train_side_by_side at the then CUDA bounds 1e-3/1e-2),
# run three times:
for i in 1 2 3; do /tmp/det/det --nocapture; done
