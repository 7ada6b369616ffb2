#!/usr/bin/env python3
"""DeepSpeed ZeRO-3 with CPU offload (the MegaTrain paper's baseline): the Llama
of torch_llama.py on one GPU, parameters and AdamW state in host memory
(`offload_param` and `offload_optimizer` to the CPU, pinned), DeepSpeed's CPU
Adam (compiled on first use), bf16 compute over fp32 master weights, global-norm
clipping at 1.0, per-block activation checkpointing. The weights keep the
layers' default initialisation (ZeRO-3 partitions them as they are built).

Prints one JSON line like torch_llama.py: median tokens/s after the warm-up
steps, GPU peak (allocator), host peak RSS, losses.

  python3 deepspeed_llama.py --config llama.json --batch 64 --seq-len 1024 --steps 5
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama import Llama, summary  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the median")
    p.add_argument("--lr", type=float, default=3e-4)
    a = p.parse_args()
    c = json.load(open(a.config))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29518", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(k, v)
    import deepspeed

    deepspeed.init_distributed()
    torch.cuda.set_device(0)
    ds_config = {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "weight_decay": 0.01}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu", "pin_memory": True},
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True,
            "contiguous_gradients": True,
        },
        "wall_clock_breakdown": False,
    }
    result = {"mode": "deepspeed-zero3-offload", "dtype": "bf16", "batch": a.batch, "seq_len": a.seq_len, "tokens_per_step": a.batch * a.seq_len}
    try:
        with deepspeed.zero.Init(config_dict_or_path=ds_config, remote_device="cpu", pin_memory=True):
            model = Llama(c, ckpt=True)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        n = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
        result["params"] = n
        g = torch.Generator().manual_seed(1)
        times, losses = [], []
        for step in range(a.steps):
            ids = torch.randint(0, c["vocab_size"], (a.batch, a.seq_len + 1), generator=g).cuda()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            logits = engine(ids[:, :-1]).float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            print(f"step {step}: {times[-1]:.2f} s, loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
            del logits, loss
        result.update(summary(times, losses, a.warmup_steps, n, a.batch * a.seq_len))
    except torch.OutOfMemoryError as e:
        result.update({"ok": False, "error": "CUDA out of memory: " + str(e).split("\n")[0][:200]})
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
