#!/usr/bin/env bash
# run33 call 1 (nvidia-h100-x1, train at d0b2229 as .device/train10.tar.xz): where the GPU memory of a
# 7B compact run at --gpu-mem-gib 10 goes. The plan, then two traced 3-step runs (the planned kept
# graphs, and --keep-graphs 0) with cubecl's memory log (page creation, to stderr) and nvidia-smi
# sampled every 100 ms with timestamps.
tar xJf .device/train10.tar.xz -C .device; . bench/gpu/cublas_env.sh >/dev/null
echo '{"arch":"llama","vocab_size":32000,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":32,"d_ff":11008,"max_seq_len":4096}' > /tmp/7b.json
A="--model /tmp/7b.json --steps 3 --warmup 1 --lr 1e-5 --seq-len 1024 --batch 4 --compute bf16 --host-layout compact --gpu-mem-gib 10 --host-mem-gib 125"
.device/bin/train --plan $A > $OUT/plan.txt 2>&1
printf '[memory.logger]\nlevel = "basic"\nstderr = true\n' > cubecl.toml
for v in planned:"" kept0:"--keep-graphs 0"; do n=${v%%:*}; x=${v#*:}
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 100 > $OUT/smi-$n.csv & s=$!
  date +%s.%N > $OUT/start-$n.txt
  BURN_OFFLOAD_TRACE=1 timeout 150 .device/bin/train $A $x --sample-tokens 0 --metrics $OUT/m-$n.jsonl > $OUT/out-$n.txt 2> $OUT/err-$n.txt; echo "$n exit $?"
  kill $s; wait $s 2>/dev/null; echo "$n smi peak $(cut -d, -f2 $OUT/smi-$n.csv | sort -n | tail -1)"
done
rm cubecl.toml; cd $OUT && tar cJf diag.tar.xz * --remove-files
