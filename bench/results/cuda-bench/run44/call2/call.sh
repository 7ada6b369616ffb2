# nvidia-h200 (fresh machine), train at 2f98d36 (.device/new/train.xz), carry [".device/new/train.xz"]
LONG_MODEL=8b LONG_SEQ=262144 LONG_STEPS=3 WAIT_S=560 LONG_FLAGS="--optim-state 8bit --fused --grad-clip 0" bash bench/gpu/long_detached.sh start 2>&1 | tail -40
