#!/usr/bin/env python3
"""The LoRA fidelity check's base model: a small random Llama, pre-trained
briefly on the training text in PyTorch (full fine-tune), saved as a Hugging
Face folder that `train --init-from` and transformers both load.

    python3 bench/hf/lora_base.py --train train.txt --out /tmp/lora-base

The shape (defaults): hidden 256, 4 layers, 8 heads / 4 KV heads, d_ff 688,
vocabulary = the tokenizer's (added tokens included), untied head, f32
safetensors. The text is tokenized as `train` tokenizes plain text
(`add_special_tokens=False`, a leading BOM dropped); pre-training draws
random windows, AdamW with linear warm-up and cosine decay. TF32 is allowed
here (the base only has to model text; the comparison starts from the saved
weights). Prints one JSON line: steps, first and last loss, seconds.
"""
import argparse
import json
import math
import os
import shutil
import time

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TOKENIZER = os.path.join(HERE, "..", "..", "tests", "fixtures", "tokenizer")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True, help="text to pre-train on")
    p.add_argument("--out", required=True, help="folder to write (created; files replaced)")
    p.add_argument("--tokenizer-dir", default=DEFAULT_TOKENIZER,
                   help="folder with tokenizer.json and tokenizer_config.json")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--max-pos", type=int, default=1024)
    p.add_argument("--steps", type=int, default=300, help="pre-training steps (0: random weights)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()

    started = time.time()
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    tok_file = os.path.join(a.tokenizer_dir, "tokenizer.json")
    tok = Tokenizer.from_file(tok_file)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    with open(a.train, encoding="utf-8") as f:
        text = f.read()
    if text.startswith("\ufeff"):
        text = text[1:]
    ids = torch.tensor(tok.encode(text, add_special_tokens=False).ids, dtype=torch.long)
    if len(ids) <= a.seq_len:
        raise SystemExit(f"{a.train}: {len(ids)} tokens, a window needs {a.seq_len + 1}")

    def special(key, fallback):
        path = os.path.join(a.tokenizer_dir, "tokenizer_config.json")
        name = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                name = json.load(f).get(key)
            if isinstance(name, dict):
                name = name.get("content")
        found = tok.token_to_id(name) if name else None
        return found if found is not None else fallback

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        head_dim=a.hidden // a.heads,
        max_position_embeddings=a.max_pos,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        initializer_range=0.02,
        bos_token_id=special("bos_token", 0),
        eos_token_id=special("eos_token", 1),
        pad_token_id=None,
        use_cache=False,
    )
    # rope_theta: transformers 5 keeps it in rope_parameters; older ones take it as a field.
    if getattr(config, "rope_parameters", None) is None:
        config.rope_theta = 10000.0
    model = LlamaForCausalLM(config).float().to(a.device)
    model.train()

    first = last = None
    if a.steps > 0:
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        gen = torch.Generator().manual_seed(a.seed)
        offs = torch.arange(a.seq_len + 1)
        for step in range(a.steps):
            if step < a.warmup:
                lr = a.lr * (step + 1) / a.warmup
            else:
                progress = (step - a.warmup) / max(1, a.steps - a.warmup)
                lr = a.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
            for g in opt.param_groups:
                g["lr"] = lr
            starts = torch.randint(0, len(ids) - a.seq_len, (a.batch,), generator=gen)
            win = ids[starts[:, None] + offs].to(a.device)
            logits = model(input_ids=win[:, :-1]).logits
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), win[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            value = loss.item() if (step == 0 or step == a.steps - 1 or step % 50 == 0) else None
            if value is not None:
                first = value if first is None else first
                last = value
                print(f"pre-train step {step}: loss {value:.4f} lr {lr:.2e}", flush=True)

    os.makedirs(a.out, exist_ok=True)
    model.eval()
    model.cpu().float().save_pretrained(a.out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        src = os.path.join(a.tokenizer_dir, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(a.out, name))
    print(json.dumps({
        "base": a.out,
        "vocab": vocab,
        "params": sum(t.numel() for t in model.parameters()),
        "train_tokens": len(ids),
        "steps": a.steps,
        "first_loss": first,
        "last_loss": last,
        "seconds": round(time.time() - started, 2),
    }), flush=True)


if __name__ == "__main__":
    main()
