#!/usr/bin/env python3
"""PyTorch + transformers + PEFT peer of `train --lora-rank`: the same LoRA
fine-tune of a Hugging Face Llama folder, the same recipe, evaluated on the
same held-out windows.

    python3 bench/peers/torch_lora.py --base /tmp/lora-base --train train.txt \
        --eval eval.txt --rank 8 --alpha 16 --targets q_proj,k_proj,v_proj,o_proj \
        --steps 200 --warmup 20 --lr 1e-3 --batch 8 --seq-len 128 --no-tf32 --out peer.json

What is replicated from `train` (examples/train/src):
  tokens     plain text as `Tokenizer::encode` (tokenizer.rs): the HF tokenizer
             with add_special_tokens=False (no BOS/EOS), a leading BOM dropped
             (data/token_cache.rs, write_tokens); one file is one document.
  batches    the batcher's draws exactly (data/batcher.rs, Source::Mapped, and
             data/rng.rs): SplitMix64 seeded with --seed, each row's start
             `below(len - seq_len)`, rows drawn in order; so step k sees the
             same windows as ours (only the adapters' random init differs).
  eval       data/held_out.rs, EvalWindows::mapped(tokens, 0, seq_len):
             consecutive windows of the eval stream, window w = tokens
             [w*S, w*S+S) with targets shifted by one, count (len-1)//S; the
             loss is the summed NLL over all their targets / (count*S).
  schedule   schedule.rs, WarmupCosine with warmup = min(warmup, steps)
             (run/job.rs `schedule`), step index from 0 (run/job.rs: lr(step)
             before step `step`): lr = peak*(s+1)/warmup for s < warmup, else
             floor + (peak-floor)/2*(1+cos(pi*min(1,(s-warmup)/max(1,steps-warmup)))).
  optimizer  AdamW over every trained tensor (the adapters' A and B: the host
             AdamW has no exclusion list, burn-offload/src/host/optim/adamw.rs):
             m,v with bias corrections, p = p*(1-lr*wd) - lr*mhat/(sqrt(vhat)+eps),
             which is torch.optim.AdamW's formula. Defaults: betas 0.9,0.999,
             eps 1e-5 (not torch's 1e-8), weight decay 0.01 (options.rs).
  clipping   global norm over all trained gradients, scale = clip/norm only when
             norm > clip (burn-offload/src/host/norm.rs clip_scale; no +1e-6).
  loss       mean cross-entropy over the batch's B*S targets, in f32.
LoRA: peft LoraConfig(r, lora_alpha, target_modules, lora_dropout=0,
bias="none", use_rslora); PEFT's own init (A Kaiming-uniform, B zero). Weights
f32; --no-tf32 for full-f32 matmuls (ours with --matmul cublas).

Writes one JSON line to --out (and stdout): base_eval_loss, final_eval_loss,
train_losses, grad_norms, lrs, eval_tokens, seconds (the whole run) and
train_seconds (the steps alone).
"""
import argparse
import glob
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

MASK64 = (1 << 64) - 1


class SplitMix64:
    """examples/train/src/data/rng.rs, bit for bit."""

    def __init__(self, state):
        self.state = state & MASK64

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next_u64() * n) >> 64


def encode_file(path, tokenizer):
    """The ids `train` makes of a plain-text file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.startswith("\ufeff"):
        text = text[1:]
    return np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)


def eval_windows(ids, seq_len):
    """(inputs, targets) [count, seq_len] of the held-out stream, as EvalWindows::mapped."""
    count = (len(ids) - 1) // seq_len
    if count < 1:
        raise SystemExit(f"eval text has {len(ids)} tokens, a window needs {seq_len + 1}")
    starts = np.arange(count) * seq_len
    idx = starts[:, None] + np.arange(seq_len)[None, :]
    return torch.from_numpy(ids[idx]), torch.from_numpy(ids[idx + 1])


@torch.no_grad()
def eval_loss(model, windows, batch, device):
    """Mean NLL over every target of the windows (f32 logits)."""
    inputs, targets = windows
    total, tokens = 0.0, 0
    was_training = model.training
    model.eval()
    for i in range(0, inputs.shape[0], batch):
        x = inputs[i:i + batch].to(device)
        y = targets[i:i + batch].to(device)
        logits = model(input_ids=x, use_cache=False).logits.float()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                 reduction="sum").double().item()
        tokens += y.numel()
    model.train(was_training)
    return total / max(tokens, 1)


def schedule(peak, warmup, total, min_ratio):
    """examples/train/src/schedule.rs WarmupCosine::lr, warmup clamped as run/job.rs does."""
    warmup = min(warmup, total)

    def lr(step):
        if step < warmup:
            return peak * (step + 1) / warmup
        decay_steps = max(total - warmup, 1)
        progress = min((step - warmup) / decay_steps, 1.0)
        floor = peak * min_ratio
        return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))

    return lr


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


def load_base(path, device):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.float().to(device)


def check_tokens(cache_root, named):
    """Compares our ids with `train`'s token cache (folders under cache_root whose
    meta.json names the file); {file: true/false}, missing files left out."""
    found = {}
    for meta_path in glob.glob(os.path.join(cache_root, "*", "meta.json")):
        with open(meta_path) as f:
            meta = json.load(f)
        for path, ids in named.items():
            real = os.path.realpath(path)
            if any(s.rsplit(" ", 2)[0] == real for s in meta.get("sources", [])):
                dtype = "<u2" if meta["width"] == 2 else "<u4"
                theirs = np.fromfile(os.path.join(os.path.dirname(meta_path), "tokens.bin"), dtype=dtype)
                found[os.path.basename(path)] = bool(len(theirs) == len(ids) and (theirs == ids).all())
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="Hugging Face folder (config.json + safetensors)")
    p.add_argument("--train", required=True, help="training text")
    p.add_argument("--eval", required=True, help="held-out text")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the base folder's)")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=8.0)
    p.add_argument("--targets", default="q_proj,v_proj")
    p.add_argument("--rslora", action="store_true")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--adam-betas", default="0.9,0.999")
    p.add_argument("--adam-eps", type=float, default=1e-5)
    p.add_argument("--grad-clip", type=float, default=1.0, help="global norm; 0 disables")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--eval-batch", type=int, default=64,
                   help="windows per evaluation forward (the sum is the same for any)")
    p.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=False,
                   help="TF32 matmuls (default off: full f32, as --matmul cublas)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--save-peft", default=None, help="also save the trained adapters here")
    p.add_argument("--check-tokens", default=None,
                   help="train's --data-cache folder: compare our ids with its token files")
    p.add_argument("--out", default=None, help="write the JSON line here")
    a = p.parse_args()

    from peft import LoraConfig, get_peft_model

    started = time.time()
    set_tf32(a.tf32)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    tok_path = a.tokenizer or os.path.join(a.base, "tokenizer.json")
    if os.path.isdir(tok_path):
        tok_path = os.path.join(tok_path, "tokenizer.json")
    tokenizer = Tokenizer.from_file(tok_path)
    train_ids = encode_file(a.train, tokenizer)
    eval_ids = encode_file(a.eval, tokenizer)
    if len(train_ids) <= a.seq_len:
        raise SystemExit(f"{a.train}: {len(train_ids)} tokens, a window needs {a.seq_len + 1}")
    windows = eval_windows(eval_ids, a.seq_len)

    model = load_base(a.base, device)
    model.config.use_cache = False
    base_eval = eval_loss(model, windows, a.eval_batch, device)
    print(f"base eval loss {base_eval:.6f} over {windows[1].numel()} tokens", flush=True)

    config = LoraConfig(
        r=a.rank,
        lora_alpha=a.alpha,
        target_modules=[t.strip() for t in a.targets.split(",") if t.strip()],
        lora_dropout=0.0,
        bias="none",
        use_rslora=a.rslora,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, config)
    model.float().to(device)
    params = [q for q in model.parameters() if q.requires_grad]
    trainable = sum(q.numel() for q in params)
    betas = tuple(float(b) for b in a.adam_betas.split(","))
    opt = torch.optim.AdamW(params, lr=a.lr, betas=betas, eps=a.adam_eps, weight_decay=a.weight_decay)
    lr_at = schedule(a.lr, a.warmup, a.steps, a.min_lr_ratio)
    rng = SplitMix64(a.seed)
    n_starts = len(train_ids) - a.seq_len
    offsets = np.arange(a.seq_len + 1)

    losses, norms, lrs = [], [], []
    model.train()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.time()
    for step in range(a.steps):
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = np.array([rng.below(n_starts) for _ in range(a.batch)], dtype=np.int64)
        win = torch.from_numpy(train_ids[starts[:, None] + offsets[None, :]]).to(device)
        logits = model(input_ids=win[:, :-1], use_cache=False).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), win[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = [q.grad for q in params if q.grad is not None]
        norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads)).item()
        if a.grad_clip > 0 and norm > a.grad_clip:
            scale = a.grad_clip / norm
            for g in grads:
                g.mul_(scale)
        opt.step()
        losses.append(loss.item())
        norms.append(norm)
        lrs.append(lr)
        if step == 0 or (step + 1) % 25 == 0 or step + 1 == a.steps:
            print(f"step {step + 1}/{a.steps} loss {losses[-1]:.4f} grad_norm {norm:.4f} lr {lr:.3e}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_seconds = time.time() - t0

    final_eval = eval_loss(model, windows, a.eval_batch, device)
    print(f"final eval loss {final_eval:.6f}", flush=True)
    if a.save_peft:
        model.save_pretrained(a.save_peft)
    result = {
        "system": "torch+peft",
        "base_eval_loss": base_eval,
        "final_eval_loss": final_eval,
        "train_losses": losses,
        "grad_norms": norms,
        "lrs": lrs,
        "eval_tokens": int(windows[1].numel()),
        "train_tokens": int(len(train_ids)),
        "trainable_params": trainable,
        "seconds": round(time.time() - started, 3),
        "train_seconds": round(train_seconds, 3),
        "recipe": {
            "rank": a.rank, "alpha": a.alpha, "targets": a.targets, "rslora": a.rslora,
            "steps": a.steps, "warmup": a.warmup, "lr": a.lr, "min_lr_ratio": a.min_lr_ratio,
            "weight_decay": a.weight_decay, "betas": list(betas), "eps": a.adam_eps,
            "grad_clip": a.grad_clip, "batch": a.batch, "seq_len": a.seq_len, "seed": a.seed,
            "tf32": a.tf32, "device": str(device),
        },
        "versions": {"torch": torch.__version__},
    }
    try:
        import peft
        import transformers

        result["versions"].update(peft=peft.__version__, transformers=transformers.__version__)
    except Exception:  # noqa: BLE001 - versions are informative only
        pass
    if a.check_tokens:
        result["tokens_match"] = check_tokens(a.check_tokens, {a.train: train_ids, a.eval: eval_ids})
    line = json.dumps(result)
    if a.out:
        with open(a.out, "w") as f:
            f.write(line + "\n")
    print(line[:400] + ("..." if len(line) > 400 else ""), flush=True)


if __name__ == "__main__":
    main()
