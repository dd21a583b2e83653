#!/usr/bin/env python3
"""bench_attention_torch_gpu.py — our fused causal GQA attention (build/bench/bench_attention_gpu) beside PyTorch's
torch.nn.functional.scaled_dot_product_attention on the same GPU, forward + backward, at issue 50's shapes:

  (8 sequences, 16 heads / 8 kv, S 1024, head_dim 64) and (4, 32 / 8, S 4096, 128), or one shape from the flags

PyTorch: bf16 q, k, v [N, H, S, hd] (k, v with the kv heads: enable_gqa=True), is_causal=True, once under each of
the flash and cuDNN backends (torch.nn.attention.sdpa_kernel); CUDA events around forward and around backward
(autograd of sum(out * dout)), medians over --iters after --warmup. Ours: the program's json line (fp32 buffers in
and out, as training calls it, bf16 inside). The table's last column is the target of issue 50, item 1: the flash
backend's forward+backward time over ours (>= 0.6 to pass). A backend that cannot run says why and is skipped.

    python3 bench/bench_attention_torch_gpu.py --ours build/bench/bench_attention_gpu [--seqs 8 --heads 16
        --kv-heads 8 --seq-len 1024 --head-dim 64] [--warmup 3 --iters 10]
Exit 77 without a GPU.
"""
import argparse
import json
import statistics
import subprocess
import sys

SHAPES = [(8, 16, 8, 1024, 64), (4, 32, 8, 4096, 128)]  # seqs, heads, kv heads, S, head_dim


def time_sdpa(torch, backend, shape, warmup, iters):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    n, h, kv, s, hd = shape
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.rand(n, h, s, hd, device="cuda", generator=gen, dtype=torch.bfloat16) * 2 - 1
    k = torch.rand(n, kv, s, hd, device="cuda", generator=gen, dtype=torch.bfloat16) * 2 - 1
    v = torch.rand(n, kv, s, hd, device="cuda", generator=gen, dtype=torch.bfloat16) * 2 - 1
    dout = torch.rand(n, h, s, hd, device="cuda", generator=gen, dtype=torch.bfloat16) * 2 - 1
    kind = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    fwd, bwd = [], []
    with sdpa_kernel([kind]):
        for it in range(warmup + iters):
            qi, ki, vi = (t.detach().requires_grad_(True) for t in (q, k, v))
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
            out = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=kv != h)
            mid.record()
            out.backward(dout)
            end.record()
            torch.cuda.synchronize()
            if it >= warmup:
                fwd.append(start.elapsed_time(mid))
                bwd.append(mid.elapsed_time(end))
    return statistics.median(fwd), statistics.median(bwd), statistics.median(a + b for a, b in zip(fwd, bwd))


def run_ours(program, shape, warmup, iters):
    n, h, kv, s, hd = shape
    cmd = [program, "--seqs", str(n), "--heads", str(h), "--kv-heads", str(kv), "--seq-len", str(s), "--head-dim",
           str(hd), "--bf16", "1", "--warmup", str(warmup), "--iters", str(iters)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        sys.stdout.write(done.stderr)
        return None
    line = next((l for l in done.stdout.splitlines() if l.startswith("json: ")), None)
    return json.loads(line[len("json: "):]) if line else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ours", required=True, help="the bench_attention_gpu program")
    for flag in ("--seqs", "--heads", "--kv-heads", "--seq-len", "--head-dim"):
        p.add_argument(flag, type=int, default=None)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    a = p.parse_args()
    given = [a.seqs, a.heads, a.kv_heads, a.seq_len, a.head_dim]
    shapes = SHAPES if all(x is None for x in given) else [tuple(x if x is not None else d for x, d in
                                                                 zip(given, SHAPES[0]))]
    import torch
    if not torch.cuda.is_available():
        print("bench_attention_torch_gpu: no CUDA device; nothing to measure")
        sys.exit(77)
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    rows, failed = [], False
    for shape in shapes:
        ours = run_ours(a.ours, shape, a.warmup, a.iters)
        peers = {}
        for backend in ("flash", "cudnn"):
            try:
                peers[backend] = time_sdpa(torch, backend, shape, a.warmup, a.iters)
                f, b, both = peers[backend]
                print(f"sdpa {backend:5s} forward {f:8.3f} ms  backward {b:8.3f} ms  fwd+bwd {both:8.3f} ms")
            except Exception as e:  # a backend this torch or GPU does not offer
                print(f"sdpa {backend}: not run ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
        rows.append((shape, ours, peers))
        failed |= ours is None
    print("\n| shape (N, H/KV, S, hd) | ours kernels | ours fwd+bwd ms | sdpa flash ms | sdpa cuDNN ms | "
          "flash / ours (target >= 0.6) |")
    print("|---|---|---:|---:|---:|---:|")
    for (n, h, kv, s, hd), ours, peers in rows:
        mine = ours["both_ms"] if ours else float("nan")
        flash = peers.get("flash", (0, 0, float("nan")))[2]
        cudnn = peers.get("cudnn", (0, 0, float("nan")))[2]
        print(f"| ({n}, {h}/{kv}, {s}, {hd}) | {ours['kernels'] if ours else 'failed'} | {mine:.3f} | {flash:.3f} | "
              f"{cudnn:.3f} | {flash / mine:.2f} |")
        print("json: " + json.dumps({"bench": "attention_vs_sdpa", "seqs": n, "heads": h, "kv_heads": kv,
                                     "seq_len": s, "head_dim": hd, "ours_ms": mine, "flash_ms": flash,
                                     "cudnn_ms": cudnn, "ratio_flash_over_ours": flash / mine}))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
