# Device call (lent as any one-GPU kind; it ran on an NVIDIA H200), carry .device/bin.tar.xz
# (train at 7fbc839: cargo build --release --features cuda -p trainer --bin train, stripped, xz'd)
# and .device/timeline.tar.xz (bench/gpu/timeline/build.sh).
bash bench/gpu/typeparam.sh   # rows 085b:4:resident 085b:4:host 085b:16:resident 085b:16:host
TL_SYSTEMS=resident TL_TOKENS="4" TL_STEPS=5 TAG=host ARGS=--host-params TL_LIMIT=150 bash bench/gpu/timeline/run.sh
