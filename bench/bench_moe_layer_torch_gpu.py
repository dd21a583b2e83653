#!/usr/bin/env python3
"""bench_moe_layer_torch_gpu.py — PyTorch MoE layers on the GPU, forward + backward, as the reference points for
bench_moe_layer_gpu at the same shape (bf16 experts, dropless, top-k softmax renormalised):

  transformers  transformers' MixtralSparseMoeBlock (whatever expert loop the installed version has), fed bf16
  grouped_mm    router + sort by expert + torch._grouped_mm for the three projections + weighted index_add:
                tests/torch_moe.py's grouped_mm_moe (the math lives there, shared with the CPU benchmark and
                the test reference; this script only builds the weights and times it)

Timing: CUDA events around forward and around backward (autograd of sum(out * dout)), median and min over
--iters after --warmup. Prints one line per variant and "json: {...}" lines; a variant that cannot run
(transformers missing, no _grouped_mm) says why and is skipped.

    python3 bench/bench_moe_layer_torch_gpu.py [--tokens 16384 --d-model 4096 --d-ff 14336 --experts 8
        --top-k 2 --warmup 3 --iters 10]
"""
import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))
import torch_moe  # noqa: E402  (tests/torch_moe.py: the layer's math)


def time_variant(name, forward, x, dout, warmup, iters):
    fwd, bwd = [], []
    for it in range(warmup + iters):
        xi = x.detach().requires_grad_(True)
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        out = forward(xi)
        mid.record()
        (out.float() * dout).sum().backward()
        end.record()
        torch.cuda.synchronize()
        if it >= warmup:
            fwd.append(start.elapsed_time(mid))
            bwd.append(mid.elapsed_time(end))
    both = [a + b for a, b in zip(fwd, bwd)]
    print(f"{name:13s} forward {statistics.median(fwd):8.3f} ms  backward {statistics.median(bwd):8.3f} ms  "
          f"fwd+bwd {statistics.median(both):8.3f} ms (min {min(both):8.3f})")
    print("json: " + json.dumps({"variant": name, "forward_ms": statistics.median(fwd),
                                 "backward_ms": statistics.median(bwd), "fwd_bwd_ms": statistics.median(both)}))


def transformers_block(a):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    cfg = MixtralConfig(hidden_size=a.d_model, intermediate_size=a.d_ff, num_local_experts=a.experts,
                        num_experts_per_tok=a.top_k)
    block = MixtralSparseMoeBlock(cfg).cuda().to(torch.bfloat16)

    def forward(x):
        out = block(x.to(torch.bfloat16).view(1, a.tokens, a.d_model))  # a bf16 block takes bf16 input
        return (out[0] if isinstance(out, tuple) else out).view(a.tokens, a.d_model)
    return forward


def grouped_mm_layer(a):
    if not hasattr(torch, "_grouped_mm"):
        raise RuntimeError("this torch has no torch._grouped_mm")
    dev, bf = "cuda", torch.bfloat16
    router = (torch.randn(a.experts, a.d_model, device=dev) * 0.02).requires_grad_(True)
    w13 = (torch.randn(a.experts, a.d_model, 2 * a.d_ff, device=dev, dtype=bf) * 0.02).requires_grad_(True)
    w2 = (torch.randn(a.experts, a.d_ff, a.d_model, device=dev, dtype=bf) * 0.02).requires_grad_(True)

    def forward(x):
        return torch_moe.grouped_mm_moe(x, router, w13, w2, a.top_k)
    return forward


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, default in [("tokens", 16384), ("d-model", 4096), ("d-ff", 14336), ("experts", 8), ("top-k", 2),
                          ("warmup", 3), ("iters", 10)]:
        p.add_argument("--" + flag, type=int, default=default)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_moe_layer_torch_gpu: no CUDA device")
        sys.exit(77)
    print(f"gpu {torch.cuda.get_device_name()} | torch {torch.__version__} | T={a.tokens} d={a.d_model} "
          f"d_ff={a.d_ff} E={a.experts} k={a.top_k}")
    torch.manual_seed(0)
    x = torch.randn(a.tokens, a.d_model, device="cuda")
    dout = torch.randn(a.tokens, a.d_model, device="cuda")
    for name, make in [("transformers", transformers_block), ("grouped_mm", grouped_mm_layer)]:
        try:
            forward = make(a)
        except Exception as e:  # a reference that is not installed is reported, not fatal
            print(f"{name:13s} unavailable: {e}")
            continue
        time_variant(name, forward, x, dout, a.warmup, a.iters)


if __name__ == "__main__":
    main()
