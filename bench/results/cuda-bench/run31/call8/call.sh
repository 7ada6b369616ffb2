# Device call (nvidia-h100-x1), carry .device/bin.tar.xz: the call-7 build plus an explicit event
# ordering the download stream behind the compute stream before each queued read (not kept), the
# prefetch taking updates that have landed, and the switches DBG_SYNC_READ, DBG_INLINE, DBG_NO_FILL.
TP_STEPS=6 TP_ROWS="085b:4:resident 085b:4:host 085b:4:host 085b:4:host 085b:16:resident 085b:16:host" TP_LIMIT=100 bash bench/gpu/typeparam.sh
