# Device call (nvidia-h100-x1), carry .device/ab-new.tar.xz .device/ab-old.tar.xz:
#   new: train at acc5d4a (burn-offload split into layers, issue 33)
#   old: train at 1e0bbba (the flat src/ before it)
# each built with `cargo build --release --features cuda -p <package> --bin train`, stripped, xz'd.
for cfg in "16 fp32" "64 bf16"; do set -- $cfg; rm -rf /tmp/ab-work; AB_BUILDS="new old" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_STEPS=9 AB_TOKENS=$1 AB_COMPUTE=$2 AB_LIMIT=150 bash bench/gpu/ab.sh; mv $OUT/ab.txt $OUT/ab-$2-$1k.txt; mv $OUT/ab.tgz $OUT/ab-$2-$1k.tgz; done
