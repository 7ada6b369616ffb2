# Device call (nvidia-h100-x1), carry .device/bin.tar.xz (train at 75bc090: gradients read from a
# copy made when the read is queued; the prefetch takes updates that have landed).
TP_STEPS=6 TP_ROWS="085b:4:resident 085b:4:host 085b:4:host 085b:16:resident 085b:16:host 085b:16:host 7b:2:host 7b:2:fused" \
  TP_LIMIT=150 bash bench/gpu/typeparam.sh
