#!/usr/bin/env python3
"""PyTorch peers of the offload engine: the same Llama shape trained in fp32,
or with bf16 compute over fp32 master weights (`--dtype bf16`).

Modes (one per process):
  resident      the whole model and AdamW on the GPU
  resident-ckpt the same with per-block activation checkpointing (the fair
                comparison for a recomputing engine)
  fsdp2-offload FSDP2 (`fully_shard`) on one GPU with `CPUOffloadPolicy`:
                parameters, gradients and AdamW live on the host

Prints one JSON line: median tokens/s over the steps after warm-up, peak GPU
memory (allocator peak and reserved), host peak RSS, losses. Only torch's
public API is used; TF32 is off so the arithmetic is fp32 like burn's.
With `--dtype bf16` the resident modes run forward and loss under
`torch.autocast(bfloat16)` and FSDP2 casts parameters with
`MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`; the
parameters, gradients and AdamW state stay fp32 and the loss is taken in fp32.

  python3 torch_llama.py --config llama.json --mode resident-ckpt --batch 16 --seq-len 1024
"""
import argparse
import json
import math
import os
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        # The mean square in fp32 (as HF's LlamaRMSNorm and burn's RmsNorm).
        rms = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * rms.to(x.dtype)) * self.weight.to(x.dtype)


def rope(x, cos, sin):
    # x: [b, h, t, hd]; rotate halves (the Llama/HF convention).
    half = x.shape[-1] // 2
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # bf16 q/k stay bf16
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h, kv = c["d_model"], c["n_head"], c.get("n_kv_head", c["n_head"])
        self.h, self.kv, self.hd = h, kv, d // h
        self.attn_norm = RMSNorm(d)
        self.q = nn.Linear(d, h * self.hd, bias=False)
        self.k = nn.Linear(d, kv * self.hd, bias=False)
        self.v = nn.Linear(d, kv * self.hd, bias=False)
        self.o = nn.Linear(h * self.hd, d, bias=False)
        self.mlp_norm = RMSNorm(d)
        self.gate = nn.Linear(d, c["d_ff"], bias=False)
        self.up = nn.Linear(d, c["d_ff"], bias=False)
        self.down = nn.Linear(c["d_ff"], d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        y = self.attn_norm(x)
        q = self.q(y).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(y).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v(y).view(b, t, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        y = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Llama(nn.Module):
    def __init__(self, c, ckpt):
        super().__init__()
        self.embed = nn.Embedding(c["vocab_size"], c["d_model"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.norm = RMSNorm(c["d_model"])
        self.head = nn.Linear(c["d_model"], c["vocab_size"], bias=False)
        self.ckpt = ckpt
        self.hd, self.theta = c["d_model"] // c["n_head"], c.get("rope_theta", 10000.0)

    def forward(self, ids):
        t, dev = ids.shape[1], ids.device
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, device=dev).float() / self.hd))
        freqs = torch.outer(torch.arange(t, device=dev).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.embed(ids)
        for block in self.blocks:
            if self.ckpt:
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        return self.head(self.norm(x))


def host_peak_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def summary(times, losses, warmup_steps, params, tokens):
    """The result fields of a finished run: the median step after the warm-up,
    its tokens/s and model TFLOPS (6 * params * tokens), the memory peaks."""
    step_s = statistics.median(times[warmup_steps:] or times)
    return {
        "ok": True,
        "tok_s_median": tokens / step_s,
        "step_s_median": step_s,
        "model_tflops": 6 * params * tokens / step_s / 1e12,
        "gpu_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "gpu_peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "host_peak_gib": host_peak_gib(),
        "losses": [round(x, 4) for x in losses],
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--mode", choices=["resident", "resident-ckpt", "fsdp2-offload"], required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the median")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="compute precision")
    a = p.parse_args()
    c = json.load(open(a.config))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    dev = torch.device("cuda")
    fsdp = a.mode == "fsdp2-offload"
    bf16 = a.dtype == "bf16"
    result = {"mode": a.mode, "dtype": a.dtype, "batch": a.batch, "seq_len": a.seq_len, "tokens_per_step": a.batch * a.seq_len}
    try:
        if fsdp:
            from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29517")
            torch.distributed.init_process_group("nccl", rank=0, world_size=1)
            torch.cuda.set_device(0)
            with torch.device("meta"):
                model = Llama(c, ckpt=True)
            policy = CPUOffloadPolicy()
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
            for block in model.blocks:
                fully_shard(block, offload_policy=policy, mp_policy=mp)
            fully_shard(model, offload_policy=policy, mp_policy=mp)
            model.to_empty(device="cpu")
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if "norm" in name:
                        param.fill_(1.0)
                    else:
                        param.normal_(0.0, 0.02)
            opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
        else:
            model = Llama(c, ckpt=a.mode == "resident-ckpt").to(dev)
            opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, fused=True)
        n = sum(p.numel() for p in model.parameters())
        result["params"] = n
        g = torch.Generator().manual_seed(1)
        times, losses = [], []
        for step in range(a.steps):
            ids = torch.randint(0, c["vocab_size"], (a.batch, a.seq_len + 1), generator=g).to(dev)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and not fsdp):
                logits = model(ids[:, :-1])
            logits = logits.float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            del logits, loss
        result.update(summary(times, losses, a.warmup_steps, n, a.batch * a.seq_len))
    except torch.OutOfMemoryError as e:
        result.update({"ok": False, "error": "CUDA out of memory: " + str(e).split("\n")[0][:200]})
    print(json.dumps(result), flush=True)
    if fsdp and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
