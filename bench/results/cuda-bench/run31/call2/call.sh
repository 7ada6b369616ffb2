# Device call (kind nvidia-h100-x1), carry .device/bin.tar.xz (train at 94c1ef1) and .device/timeline.tar.xz.
bash bench/gpu/typeparam.sh   # rows 085b:4:resident 085b:4:host 085b:16:resident 085b:16:host
TL_SYSTEMS=resident TL_TOKENS="4" TL_STEPS=5 TAG=host ARGS=--host-params TL_LIMIT=150 bash bench/gpu/timeline/run.sh
