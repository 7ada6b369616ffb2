#!/usr/bin/env bash
# run33 call 2 (nvidia-h100-x1, train at 1fa... with head marks, as .device/train11.tar.xz): the 7B
# compact run at --gpu-mem-gib 10 traced with the driver's used bytes at every mark and cubecl's full
# memory log (every reservation and new page) in a file; then the same with --loss-chunk-tokens 1024.
tar xJf .device/train11.tar.xz -C .device; . bench/gpu/cublas_env.sh >/dev/null
echo '{"arch":"llama","vocab_size":32000,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":32,"d_ff":11008,"max_seq_len":4096}' > /tmp/7b.json
A="--model /tmp/7b.json --steps 2 --warmup 1 --lr 1e-5 --seq-len 1024 --batch 4 --compute bf16 --host-layout compact --gpu-mem-gib 10 --host-mem-gib 125 --sample-tokens 0"
for v in chunk4k:"" chunk1k:"--loss-chunk-tokens 1024"; do n=${v%%:*}; x=${v#*:}
  printf '[memory.logger]\nlevel = "full"\nfile = "%s"\n' $OUT/mem-$n.log > cubecl.toml
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 100 > $OUT/smi-$n.csv & s=$!
  BURN_OFFLOAD_TRACE=1 timeout 150 .device/bin/train $A $x --metrics $OUT/m-$n.jsonl > $OUT/out-$n.txt 2> $OUT/err-$n.txt; echo "$n exit $?"
  kill $s; wait $s 2>/dev/null; echo "$n smi peak $(cut -d, -f2 $OUT/smi-$n.csv | sort -n | tail -1)"
  grep "head" $OUT/err-$n.txt | head -8 | cut -c60-
done
rm cubecl.toml; cd $OUT && ls -la && tar cJf diag.tar.xz * --remove-files
