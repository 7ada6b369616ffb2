# Device call (kind nvidia-h100-x1: an H100 80GB HBM3), carry .device/bin.tar.xz (train at 5df6a9b).
TP_STEPS=6 TP_ROWS="085b:4:resident 085b:4:host 085b:4:host 085b:16:resident 085b:16:host 7b:2:resident 7b:2:host 7b:2:fused" \
  TP_LIMIT=150 bash bench/gpu/typeparam.sh
