#!/usr/bin/env python3
"""cuBLAS (through PyTorch) on the shapes of examples/train/src/bin/gemm_bench.rs:
the ceiling a matmul of the bench block can reach on this GPU. TF32 off."""
import json, sys, time
import torch

torch.backends.cuda.matmul.allow_tf32 = False
t = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
d, ff, vocab = 2048, 5632, 32000
cases = [("mlp_up", t, d, ff, False, False), ("mlp_up_wgrad", d, t, ff, True, False),
         ("mlp_up_igrad", t, ff, d, False, True), ("head_chunk", 4096, d, vocab, False, False),
         ("attn_proj", t, d, d, False, False), ("mlp_down", t, ff, d, False, False)]
for dtype in (torch.bfloat16, torch.float32):
    for name, m, k, n, lt, rt in cases:
        a = torch.randn(k, m, device="cuda", dtype=dtype).t() if lt else torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(n, k, device="cuda", dtype=dtype).t() if rt else torch.randn(k, n, device="cuda", dtype=dtype)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        reps = 10
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        torch.cuda.synchronize()
        tflops = 2 * m * k * n * reps / (time.perf_counter() - start) / 1e12
        print(json.dumps({"case": name, "m": m, "k": k, "n": n, "dtype": str(dtype).split(".")[1],
                          "strategy": "torch (cuBLAS)", "tflops": tflops}), flush=True)
