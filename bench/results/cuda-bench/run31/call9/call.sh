# Device call (the same H100, warm), the call-8 build.
R="085b:4:host 085b:4:host"; for cfg in syncread inline nofill all; do echo "== $cfg" >> $OUT/typeparam.txt
  case $cfg in syncread) E="DBG_SYNC_READ=1";; inline) E="DBG_INLINE=1";; nofill) E="DBG_NO_FILL=1";;
    all) E="DBG_SYNC_READ=1 DBG_INLINE=1 DBG_NO_FILL=1 DBG_NO_PREFETCH=1 DBG_SYNC_PAGEIN=1";; esac
  env $E TP_STEPS=3 TP_ROWS="$R" TP_LIMIT=100 bash bench/gpu/typeparam.sh > /dev/null 2>&1; done
