"""Merges a PEFT LoRA adapter folder into its base by PEFT's formula, with
numpy alone, and compares the result with a merged export.

    python3 bench/hf/peft_merge.py BASE ADAPTERS MERGED

BASE: the Hugging Face folder the adapters were trained on (its
*.safetensors); ADAPTERS: `train --export-peft`'s folder (or PEFT's own
`save_pretrained`); MERGED: `train --export-hf ... --merge-lora`'s folder.
For every `base_model.model.<module>.lora_A.weight` / `lora_B.weight` pair,
PEFT's merge (peft/tuners/lora/layer.py, `get_delta_weight`) is

    W' = W + scale * (B @ A)            (transposed when fan_in_fan_out)
    scale = lora_alpha / r              (lora_alpha / sqrt(r) with use_rslora)

Checks: every adapter pair names a base weight, A is [r, in] and B [out, r]
for it, each merged weight equals W' within 1e-5 of its largest value, and
every other tensor of MERGED equals BASE's. Prints one line per check and
exits 1 on the first failure. Needs numpy and safetensors (no torch).
"""
import glob
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def tensors(folder):
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        out.update(load_file(path))
    return out


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def main(base_dir, adapter_dir, merged_dir):
    config = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    r, alpha = config["r"], config["lora_alpha"]
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    fan_in_fan_out = bool(config.get("fan_in_fan_out"))
    base = tensors(base_dir)
    merged = tensors(merged_dir)
    adapters = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    prefix = "base_model.model."
    modules = sorted({k[len(prefix):].rsplit(".lora_", 1)[0] for k in adapters})
    print(f"r {r}, lora_alpha {alpha}, scale {scale:g}, {len(modules)} adapted modules")
    adapted = set()
    for module in modules:
        a = adapters[f"{prefix}{module}.lora_A.weight"].astype(np.float64)
        b = adapters[f"{prefix}{module}.lora_B.weight"].astype(np.float64)
        name = f"{module}.weight"
        if name not in base:
            fail(f"{name}: no such base weight")
        w = base[name].astype(np.float64)
        delta = scale * (b @ a)
        if fan_in_fan_out:
            delta = delta.T
        if a.shape[0] != r or b.shape[1] != r or delta.shape != w.shape:
            fail(f"{name}: A {a.shape}, B {b.shape} against W {w.shape}")
        want = w + delta
        got = merged[name].astype(np.float64)
        err = np.abs(got - want).max()
        bound = 1e-5 * max(np.abs(want).max(), 1.0)
        moved = np.abs(delta).max()
        print(f"{name}: max |merged - (W + scale*B@A)| = {err:.3g} (bound {bound:.3g}), max |delta| = {moved:.3g}")
        if err > bound:
            fail(name)
        adapted.add(name)
    for name, value in base.items():
        if name in adapted:
            continue
        if name not in merged:
            fail(f"{name}: missing from the merged folder")
        if not np.array_equal(merged[name], value):
            fail(f"{name}: changed, but no adapter sits on it")
    print(f"OK: {len(adapted)} merged weights match PEFT's formula, {len(base) - len(adapted)} others unchanged")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
