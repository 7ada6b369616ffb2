#!/usr/bin/env bash
# run33 call 9 (nvidia-h100-x1): DeepSpeed ZeRO-3 with CPU offload on the 7B at 64k tokens a step, bf16
# (bench/peers/deepspeed_llama.py). DeepSpeed 0.19.8's source package and its dependencies' wheels are
# carried in .device/dsw (here: pip download deepspeed; pip download --only-binary=:all: --platform
# manylinux2014_x86_64 --python-version 3.12 hjson ninja py-cpuinfo msgpack pydantic einops nvidia-ml-py
# psutil setuptools wheel) and used from PYTHONPATH; its CPU Adam compiles on first use.
D=/tmp/dspy; mkdir -p $D; for w in .device/dsw/*.whl; do python3 -m zipfile -e $w $D; done
tar xzf .device/dsw/deepspeed-0.19.8.tar.gz -C /tmp
nb=$(find $D -path '*ninja*' -name ninja -type f | head -1); chmod +x $nb; mkdir -p /tmp/dsbin; ln -sf $(readlink -f $nb) /tmp/dsbin/ninja
export PYTHONPATH=$D:/tmp/deepspeed-0.19.8 PATH=/tmp/dsbin:/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda DS_SKIP_CUDA_CHECK=1
ninja --version; nvcc --version | tail -1; python3 -c "import torch, deepspeed; print(torch.__version__, torch.version.cuda, deepspeed.__version__)" 2>&1 | tail -1
echo '{"arch":"llama","vocab_size":32000,"d_model":4096,"n_layer":32,"n_head":32,"n_kv_head":32,"d_ff":11008,"max_seq_len":4096}' > /tmp/llama-7b.json
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $OUT/ds.gpumem & poll=$!
/usr/bin/time -v timeout 480 python3 bench/peers/deepspeed_llama.py --config /tmp/llama-7b.json --batch 64 --seq-len 1024 --steps 5 > $OUT/ds.json 2> $OUT/ds.err; echo "exit $?"
kill $poll; echo "gpu peak MiB $(sort -n $OUT/ds.gpumem | tail -1)"; rm $OUT/ds.gpumem
cat $OUT/ds.json; grep -E "^step|Error|error:|Killed|Maximum resident|Elapsed" $OUT/ds.err | tail -15; xz $OUT/ds.err
