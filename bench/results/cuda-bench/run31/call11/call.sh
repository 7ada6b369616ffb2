# Device call (nvidia-h100-x1), carry .device/bin.tar.xz (train at 75bc090), .device/timeline.tar.xz.
TL_SYSTEMS=resident TL_TOKENS="4" TL_STEPS=5 TAG=host ARGS=--host-params TL_LIMIT=150 bash bench/gpu/timeline/run.sh
