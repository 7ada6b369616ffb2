#!/usr/bin/env python3
"""transformers' `generate` with its key/value cache, the peer of `chat`'s
generation (bench/gpu/generate.sh): prefill tokens/s over a prompt and decode
tokens/s after it, greedy, on one GPU.

Two modes:

  python3 bench/peers/hf_generate.py --make-model DIR [--dtype bf16]
      writes the 0.85B Llama shape (16 layers x 2048, 32/8 heads, d_ff 5632,
      vocabulary 32,000) with transformers' random initialisation as a
      Hugging Face folder (bf16 safetensors, no end-of-sequence id: a reply
      runs its whole length), for both sides to load.

  python3 bench/peers/hf_generate.py --model DIR --prompt-tokens 2048 \
      --new-tokens 256 --dtype bf16 --repeat 3
      times `model.generate` (do_sample=False, the default dynamic cache,
      SDPA attention) on a prompt of byte values (the ids `chat --tokenizer
      byte` gives the same text): prefill is one generate of one new token,
      decode is (generate of N) minus (generate of 1) over N - 1 tokens, the
      fastest of --repeat runs after a warm-up. Prints one JSON line.

Needs torch and transformers.
"""
import argparse
import json
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def make_model(folder, dtype):
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(DTYPES[dtype])
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {folder}: {params:,} parameters in {dtype}")


def prompt_ids(tokens):
    """The byte values of a fixed text of `tokens` characters (what `chat
    --tokenizer byte --raw` makes of the same text)."""
    text = prompt_text(tokens)
    return list(text.encode())


def prompt_text(tokens):
    words = "the model streams its blocks through the device one at a time and keeps a cache ".split()
    out, i = [], 0
    while len(" ".join(out)) < tokens:
        out.append(words[i % len(words)])
        i += 1
    return " ".join(out)[:tokens]


def timed(model, ids, new_tokens):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(
        ids,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + new_tokens
    return time.perf_counter() - start, out[0, ids.shape[1]:].tolist()


def bench(args):
    model = (
        AutoModelForCausalLM.from_pretrained(args.model, dtype=DTYPES[args.dtype])
        .cuda()
        .eval()
    )
    ids = torch.tensor([prompt_ids(args.prompt_tokens)], device="cuda")
    with torch.inference_mode():
        timed(model, ids, 8)  # warm-up
        prefill = min(timed(model, ids, 1)[0] for _ in range(args.repeat))
        runs = [timed(model, ids, args.new_tokens) for _ in range(args.repeat)]
    whole = min(t for t, _ in runs)
    decode_s = max(whole - prefill, 1e-9)
    row = {
        "system": "transformers",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "dtype": args.dtype,
        "attention": model.config._attn_implementation,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "prefill_s": prefill,
        "prefill_tok_s": args.prompt_tokens / prefill,
        "decode_s": decode_s,
        "decode_tok_s": (args.new_tokens - 1) / decode_s,
        "first_ids": runs[-1][1][:16],
    }
    print(json.dumps(row))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--make-model")
    ap.add_argument("--model")
    ap.add_argument("--prompt-text", type=int, help="print the prompt of this many tokens and exit")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--dtype", choices=DTYPES, default="bf16")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.prompt_text:
        print(prompt_text(args.prompt_text), end="")
    elif args.make_model:
        make_model(args.make_model, args.dtype)
    else:
        bench(args)


main()
