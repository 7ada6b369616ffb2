# Device call (the same H100, warm), carry .device/bin.tar.xz (train at 5df6a9b), .device/timeline.tar.xz.
TL_SYSTEMS=resident TL_TOKENS="4" TL_STEPS=5 TAG=host ARGS=--host-params TL_LIMIT=150 bash bench/gpu/timeline/run.sh
