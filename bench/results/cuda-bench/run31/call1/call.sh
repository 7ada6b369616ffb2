# Device call (kind nvidia-h100-x1), carry .device/tp.tar.xz (train at the end of the last session,
# 23f11b7's Offload path) as .device/bin.tar.xz, and .device/timeline.tar.xz: where the type
# parameter's step went before this run's changes.
TL_SYSTEMS=resident TL_TOKENS="4" TL_STEPS=4 TAG=plain TL_LIMIT=120 bash bench/gpu/timeline/run.sh
TL_SYSTEMS=resident TL_TOKENS="4 16" TL_STEPS=4 TAG=host ARGS=--host-params TL_LIMIT=150 bash bench/gpu/timeline/run.sh
