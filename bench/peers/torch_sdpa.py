"""PyTorch's scaled_dot_product_attention on the shapes of bench attention_bench
--lengths: one sequence, 32 query heads over 8 key/value heads, head width 64,
causal (head width --head-dim, 64 by default), forward alone and forward+backward, timed with CUDA events (median of
--reps after two untimed runs). TFLOPS as FlashAttention counts them: the
forward 2*h*s^2*d over the causal half, the backward 2.5 times that.

    python3 bench/peers/torch_sdpa.py --lengths 16384,65536 --backend flash

Grouped-query heads go to sdpa with enable_gqa; a backend that refuses them
gets the key/value heads repeated (the "gqa" field says which ran).
One JSON object per line."""
import argparse, json, statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(reps, f):
    ms = []
    for rep in range(reps + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        f()
        end.record()
        torch.cuda.synchronize()
        if rep >= 2:
            ms.append(start.elapsed_time(end))
    return statistics.median(ms)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="16384")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--backend", choices=["flash", "efficient", "math", "cudnn"], default="flash")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--heads", default="32,8", help="query heads,key/value heads")
    a = p.parse_args()
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}[a.backend]
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    heads, kv = map(int, a.heads.split(","))
    d = a.head_dim
    for seq in map(int, a.lengths.split(",")):
        q = torch.randn(1, heads, seq, d, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(1, kv, seq, d, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(1, kv, seq, d, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.randn(1, heads, seq, d, device="cuda", dtype=dtype)
        flops = 2.0 * heads * seq * seq * d
        row = {"backend": a.backend, "seq": seq, "heads": heads, "kv_heads": kv, "head_dim": d, "dtype": a.dtype}
        for gqa in ("enable_gqa", "repeated"):
            try:
                def attention():
                    if gqa == "enable_gqa":
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    kr = k.repeat_interleave(heads // kv, dim=1)
                    vr = v.repeat_interleave(heads // kv, dim=1)
                    return F.scaled_dot_product_attention(q, kr, vr, is_causal=True)

                def both():
                    out = attention()
                    torch.autograd.grad(out, (q, k, v), w)

                with sdpa_kernel(backend):
                    with torch.no_grad():
                        fwd = timed(a.reps, attention)
                    fb = timed(a.reps, both)
                row.update({"gqa": gqa, "forward_ms": round(fwd, 3), "forward_tflops": round(flops / fwd * 1e-9, 1),
                            "forward_backward_ms": round(fb, 3),
                            "forward_backward_tflops": round(3.5 * flops / fb * 1e-9, 1)})
                break
            except RuntimeError as e:
                row["error_" + gqa] = str(e).split("\n")[0][:200]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
