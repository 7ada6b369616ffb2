#!/usr/bin/env python3
"""`train --export-peft` and `--export-hf --merge-lora` read back by
transformers and PEFT: the base with our adapters (PeftModel.from_pretrained)
against our merged folder on the same tokens, and the eval loss of each on the
held-out windows `train --eval-data` uses.

    python3 bench/hf/peft_interop.py --base /tmp/lora-base --peft /tmp/ours-peft \
        --merged /tmp/ours-merged --eval eval.txt --seq-len 128 --batch 8 \
        [--peft-extra nf4=/tmp/ours-nf4-peft] --out interop.json

Everything in f32 with TF32 off. Reports (one JSON line, also to --out):
  logits_max_abs_diff   base+adapters vs merged, over the first --batch eval
                        windows (acceptance <= 1e-4)
  base_eval_loss, adapter_eval_loss, merged_eval_loss, <name>_eval_loss for
  each --peft-extra (the same base with that adapter folder).
The windows and tokens are bench/peers/torch_lora.py's (train's own).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from torch_lora import encode_file, eval_loss, eval_windows, load_base, set_tf32  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


@torch.no_grad()
def logits_of(model, x):
    model.eval()
    return model(input_ids=x, use_cache=False).logits.float()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True)
    p.add_argument("--peft", required=True, help="adapter folder (train --export-peft)")
    p.add_argument("--merged", default=None, help="merged HF folder (train --export-hf --merge-lora)")
    p.add_argument("--eval", required=True, help="held-out text")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the base folder's)")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--batch", type=int, default=8, help="windows whose logits are compared")
    p.add_argument("--eval-batch", type=int, default=64,
                   help="windows per evaluation forward (the sum is the same for any)")
    p.add_argument("--peft-extra", action="append", default=[],
                   help="NAME=FOLDER: another adapter folder on the same base, its eval loss reported")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None)
    a = p.parse_args()

    from peft import PeftModel

    started = time.time()
    set_tf32(False)
    device = torch.device(a.device)
    tok_path = a.tokenizer or os.path.join(a.base, "tokenizer.json")
    windows = eval_windows(encode_file(a.eval, Tokenizer.from_file(tok_path)), a.seq_len)
    fixed = windows[0][: a.batch].to(device)
    result = {"eval_tokens": int(windows[1].numel()), "logits_tokens": int(fixed.numel())}

    base = load_base(a.base, device)
    result["base_eval_loss"] = eval_loss(base, windows, a.eval_batch, device)
    base_logits = logits_of(base, fixed)

    adapted = PeftModel.from_pretrained(base, a.peft, is_trainable=False).to(device)
    result["adapter_eval_loss"] = eval_loss(adapted, windows, a.eval_batch, device)
    adapter_logits = logits_of(adapted, fixed)
    result["adapter_vs_base_logits_max_abs_diff"] = (adapter_logits - base_logits).abs().max().item()
    del adapted, base

    if a.merged:
        merged = load_base(a.merged, device)
        merged_logits = logits_of(merged, fixed)
        diff = (merged_logits - adapter_logits).abs()
        result["logits_max_abs_diff"] = diff.max().item()
        result["logits_mean_abs_diff"] = diff.mean().item()
        result["logits_max_abs"] = adapter_logits.abs().max().item()
        result["merged_eval_loss"] = eval_loss(merged, windows, a.eval_batch, device)
        del merged

    for spec in a.peft_extra:
        name, _, folder = spec.partition("=")
        if not folder:
            raise SystemExit(f"--peft-extra takes NAME=FOLDER, got {spec!r}")
        base = load_base(a.base, device)
        model = PeftModel.from_pretrained(base, folder, is_trainable=False).to(device)
        result[f"{name}_eval_loss"] = eval_loss(model, windows, a.eval_batch, device)
        del model, base

    result["seconds"] = round(time.time() - started, 3)
    checks = {"adapter_below_base": result["adapter_eval_loss"] < result["base_eval_loss"]}
    if "logits_max_abs_diff" in result:
        checks["merged_matches_adapter"] = result["logits_max_abs_diff"] <= 1e-4
    result["checks"] = checks
    line = json.dumps(result)
    if a.out:
        with open(a.out, "w") as f:
            f.write(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main()
