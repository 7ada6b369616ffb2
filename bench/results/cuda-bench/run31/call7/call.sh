# Device call (nvidia-h100-x1), carry .device/bin.tar.xz: train at 5df6a9b plus diagnostic switches
# (not committed): DBG_SYNC_PAGEIN (a host wait after each page-in), DBG_NO_PREFETCH.
R="085b:4:host 085b:4:host"; for cfg in default noprefetch syncpage both; do echo "== $cfg" >> $OUT/typeparam.txt
  case $cfg in default) E="";; noprefetch) E="DBG_NO_PREFETCH=1";; syncpage) E="DBG_SYNC_PAGEIN=1";; both) E="DBG_NO_PREFETCH=1 DBG_SYNC_PAGEIN=1";; esac
  env $E TP_STEPS=4 TP_ROWS="$R" TP_LIMIT=100 bash bench/gpu/typeparam.sh > /dev/null 2>&1; done
