#!/usr/bin/env python3
"""MegaTrain (github.com/DLYuanGod/MegaTrain) as a peer: the Llama of our JSON
config, built with transformers (`LlamaConfig`, `LlamaForCausalLM`, random
init, nothing downloaded) and trained by MegaTrain's own engine,
`infinity.CPUMasterModel`, a step exactly as its examples/sft/train.py does
one: `forward_and_backward(input_ids, attention_mask, labels)`, global-norm
clipping at 1.0 over `get_parameters()`, the optimizer step on the host,
`_sync_params_to_gpu()`, `zero_grad()` of model and optimizer.

What the engine does: the master weights live on the host (pinned flat copy
per layer); the GPU holds the embedding, final norm and LM head, and two
double-buffered layer slots the layers stream through; the forward keeps a
checkpoint every `--checkpoint-interval` layers and the backward recomputes
each block; gradients go back through pinned slabs and a host thread adds
them into the host parameters' .grad; the loss is cross-entropy over chunks
of 128 positions. MegaTrain keeps no fp32 copy: with `--dtype bf16` (its
configs' dtype) the host master weights, gradients and AdamW state are bf16
too (unlike torch_llama.py --dtype bf16, which keeps them fp32). The optimizer
is train.py's choice: DeepSpeed's CPUAdam where `deepspeed` imports, else
`torch.optim.AdamW` on the host tensors (`--optimizer` forces one).

Attention: `--attn sdpa` (flash-attn is not needed; MegaTrain's configs ask for
flash_attention_2). MegaTrain hands the `[B, T]` attention mask it is given to
every decoder layer as is, which suits flash_attention_2 (a padding mask,
causal from the module) but not sdpa: transformers' sdpa path passes it to
`scaled_dot_product_attention` as `attn_mask` and turns `is_causal` off, so an
int64 mask of ones (MegaTrain's collate_fn) fails and a bool one attends
both ways. `--mask none` (the default) gives the engine a stand-in whose
`.to(device)` is None: the layers then get `attention_mask=None`, as
transformers' own LlamaModel gives sdpa layers for an unpadded batch, and
sdpa runs causal (`is_causal=True`, `enable_gqa`), the call torch_llama.py
makes. `--mask ones` passes the literal int64 ones (for flash_attention_2).

MegaTrain is imported from `--megatrain-dir` (default `.device/megatrain`,
filled by bench/peers/megatrain_fetch.sh; on the device tool pass carry
[".device/megatrain"]). Nothing of it is copied here.

Prints one JSON line like torch_llama.py: median tokens/s over the steps after
warm-up, model TFLOPS (6 * params * tokens), GPU peak (allocator, reserved),
host peak RSS, losses; also the engine's own forward/backward split.

  python3 bench/peers/megatrain_llama.py --config llama.json --batch 1 --seq-len 65536 --steps 4 --warmup-steps 2
"""
import argparse
import json
import logging
import os
import statistics
import sys
import time

# As examples/sft/train.py sets it (before the first CUDA allocation).
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from torch_llama import summary  # noqa: E402


class NoMask:
    """The attention mask handed to `forward_and_backward`: the engine's only
    use of it is `attention_mask.to(device)` (cpu_master.py
    `_forward_and_backward_single_gpu`), which gives None here, so the layers
    get `attention_mask=None` and sdpa runs with `is_causal=True`."""

    def to(self, *args, **kwargs):
        return None


def import_megatrain(path):
    path = os.path.abspath(path)
    if not os.path.isfile(os.path.join(path, "infinity", "model", "cpu_master.py")):
        sys.exit(f"no MegaTrain at {path}: run bench/peers/megatrain_fetch.sh "
                 "(and carry .device/megatrain to the GPU machine)")
    sys.path.insert(0, path)
    import infinity
    from infinity import CPUMasterModel
    from infinity.config import CPUMasterConfig
    from infinity.model import cpu_master

    commit = None
    if os.path.isfile(os.path.join(path, "COMMIT")):
        commit = open(os.path.join(path, "COMMIT")).read().strip()
    return infinity, CPUMasterModel, CPUMasterConfig, cpu_master, commit


def hf_llama(c, seq_len, attn, dtype):
    """transformers' Llama of our JSON config, random init (std 0.02, norms
    at one), parameters in `dtype` as train.py's from_pretrained gives them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if c.get("arch", "llama") != "llama":
        sys.exit(f"arch {c.get('arch')!r}: only llama")
    kw = dict(
        vocab_size=c["vocab_size"],
        hidden_size=c["d_model"],
        num_hidden_layers=c["n_layer"],
        num_attention_heads=c["n_head"],
        num_key_value_heads=c.get("n_kv_head", c["n_head"]),
        intermediate_size=c["d_ff"],
        max_position_embeddings=max(c.get("max_seq_len", 4096), seq_len),
        rms_norm_eps=c.get("rms_norm_eps", 1e-5),
        tie_word_embeddings=c.get("tie_embeddings", False),
        attention_bias=False,
        mlp_bias=False,
        attn_implementation=attn,
    )
    if c.get("head_dim"):
        kw["head_dim"] = c["head_dim"]
    cfg = LlamaConfig(**kw)
    theta = float(c.get("rope_theta", 10000.0))
    if isinstance(getattr(cfg, "rope_parameters", None), dict):  # transformers 5
        cfg.rope_parameters["rope_theta"] = theta
    else:
        cfg.rope_theta = theta
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    # from_pretrained (train.py) returns the model in eval mode; dropout is 0 either way.
    return model.eval()


def make_optimizer(kind, params, mcfg):
    """examples/sft/train.py's optimizer: DeepSpeedCPUAdam when it imports,
    else torch.optim.AdamW, both over the host parameters."""
    if kind in ("auto", "deepspeed-cpu-adam"):
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            opt = DeepSpeedCPUAdam(params, lr=mcfg.learning_rate, betas=(mcfg.beta1, mcfg.beta2),
                                   eps=mcfg.eps, weight_decay=mcfg.weight_decay, adamw_mode=True)
            return opt, "deepspeed-cpu-adam"
        except ImportError:
            if kind != "auto":
                raise
    opt = torch.optim.AdamW(params, lr=mcfg.learning_rate, betas=(mcfg.beta1, mcfg.beta2),
                            eps=mcfg.eps, weight_decay=mcfg.weight_decay)
    return opt, "torch-adamw"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the median")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                   help="MegaTrain's config.dtype: compute and the host master weights alike")
    p.add_argument("--attn", choices=["sdpa", "flash_attention_2", "eager"], default="sdpa")
    p.add_argument("--mask", choices=["none", "ones"], default="none",
                   help="none: layers get attention_mask=None (causal sdpa); ones: MegaTrain's [B, T] int64 ones")
    p.add_argument("--optimizer", choices=["auto", "torch-adamw", "deepspeed-cpu-adam"], default="auto")
    p.add_argument("--checkpoint-interval", type=int, default=4, help="layers per recomputed block (its configs: 4)")
    p.add_argument("--num-grad-slabs", type=int, default=12, help="pinned gradient slabs (its configs: 12)")
    p.add_argument("--megatrain-dir", default=os.path.join(REPO, ".device", "megatrain"))
    p.add_argument("--verbose", action="store_true", help="MegaTrain's INFO log on stderr")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s [%(levelname)s] %(name)s: %(message)s")
    c = json.load(open(a.config))
    infinity, CPUMasterModel, CPUMasterConfig, cpu_master, commit = import_megatrain(a.megatrain_dir)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    torch.cuda.set_device(0)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    result = {
        "mode": "megatrain", "dtype": a.dtype, "batch": a.batch, "seq_len": a.seq_len,
        "tokens_per_step": a.batch * a.seq_len, "megatrain_commit": commit, "attn": a.attn, "mask": a.mask,
        "checkpoint_interval": a.checkpoint_interval, "flash_ce": bool(cpu_master.FLASH_CE_AVAILABLE),
    }
    model = None
    try:
        hf = hf_llama(c, a.seq_len, a.attn, dtype)
        mcfg = CPUMasterConfig(
            model_name="random-init", dataset_path="random-tokens", device=0, dtype=dtype,
            attn_implementation=a.attn, trust_remote_code=False, max_seq_len=a.seq_len,
            batch_size=a.batch, gradient_accumulation_steps=1, num_steps=a.steps,
            learning_rate=a.lr, weight_decay=0.01, max_grad_norm=1.0, seed=0,
            checkpoint_interval=a.checkpoint_interval, num_grad_slabs=a.num_grad_slabs,
        )
        result["attn_implementation"] = getattr(hf.config, "_attn_implementation", None)
        model = CPUMasterModel(hf, mcfg)
        del hf
        params = model.get_parameters()
        n = sum(p.numel() for p in params)
        result["params"] = n
        optimizer, result["optimizer"] = make_optimizer(a.optimizer, params, mcfg)
        print(f"megatrain {commit}: {n} params, {result['optimizer']}, attn {result['attn_implementation']}, "
              f"mask {a.mask}", file=sys.stderr, flush=True)
        g = torch.Generator().manual_seed(1)
        times, losses, fwd, bwd, opt_s = [], [], [], [], []
        for step in range(a.steps):
            # Host tensors, as train.py's DataLoader gives them; the engine moves
            # them. Labels are the inputs: the engine shifts them itself.
            ids = torch.randint(0, c["vocab_size"], (a.batch, a.seq_len), generator=g)
            labels = ids.clone()
            mask = NoMask() if a.mask == "none" else torch.ones_like(ids)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss_val, _, timing = model.forward_and_backward(ids, mask, labels)
            t1 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.get_parameters(), mcfg.max_grad_norm)
            optimizer.step()
            model._sync_params_to_gpu()
            model.zero_grad()
            optimizer.zero_grad()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            times.append(t2 - t0)
            losses.append(float(loss_val))
            fwd.append(timing["forward"])
            bwd.append(timing["backward"])
            opt_s.append(t2 - t1)
            print(f"step {step}: {times[-1]:.2f} s (fwd {fwd[-1]:.2f}, bwd {bwd[-1]:.2f}, "
                  f"clip+opt+sync {opt_s[-1]:.2f}), loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
        result.update(summary(times, losses, a.warmup_steps, n, a.batch * a.seq_len))
        w = a.warmup_steps if a.warmup_steps < len(times) else 0
        result.update({
            "fwd_s_median": statistics.median(fwd[w:]),
            "bwd_s_median": statistics.median(bwd[w:]),
            "opt_s_median": statistics.median(opt_s[w:]),
            "step_s": [round(t, 3) for t in times],
        })
    except torch.OutOfMemoryError as e:
        result.update({"ok": False, "error": "CUDA out of memory: " + str(e).split("\n")[0][:200]})
    finally:
        if model is not None:
            model.cleanup()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
