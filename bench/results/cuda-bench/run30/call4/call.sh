# Device call (nvidia-h100-x1), carry .device/tp.tar.xz .device/ab-tp.tar.xz .device/ab-base.tar.xz:
# tp = train with the upload pool reclaimed per 256 MiB outside binds (this commit), base = acc5d4a.
# The rows of call3/call.sh for resident and host (4k, 16k), then:
rm -rf /tmp/ab-work; AB_BUILDS="tp base" AB_SYSTEMS=pipelined AB_ROUNDS=2 AB_STEPS=9 AB_TOKENS=16 AB_COMPUTE=fp32 AB_LIMIT=150 bash bench/gpu/ab.sh
