#!/usr/bin/python3
"""bench_moe_layer_torch.py — the CPU MoE layer's forward and backward written in idiomatic PyTorch, as a
reference point for bench_moe_layer.c at the same shape.

The layer is tests/torch_moe.py's SparseMoeBlock (the math lives there, shared with the test reference):
logits = x Wr^T -> softmax -> top-k -> renormalise -> for each expert: index_select its rows, SwiGLU
(w2 (silu(x w1^T) * (x w3^T))), scale by the gate, index_add_ into the output; plus the load-balancing loss
(E * sum_e f_e P_e, coef 0.01) and the router z-loss (mean logsumexp^2, coef 0.001). Dropless unless
--capacity-factor > 0 (then C = ceil(cf T k / E) per expert, with router/capacity.h's 1e-6 relative slack;
earlier tokens kept). Backward is autograd of sum(out * dout) + the weighted losses, giving dx and every
weight gradient.

--autocast-bf16 runs the forward (the layer and the loss) under torch.autocast('cpu', dtype=torch.bfloat16)
and the backward outside it, as PyTorch recommends: every GEMM, the router's included, takes bf16 inputs and
gives bf16 outputs (the backward's GEMMs follow), while tests/torch_moe.py takes the router logits back to
float32 for the scores, top-k, gates, losses and the combine, as Hugging Face's Mixtral does. Weights,
gradients, x and dx stay float32. Default: everything in float32.

Measures forward, backward and forward+backward wall time (median and min over --iters timed iterations
after --warmup untimed ones, time.perf_counter). Last line: "json: {...}".

Run with Debian's python (it has python3-torch):
    /usr/bin/python3 bench/bench_moe_layer_torch.py [--tokens 4096 --d-model 512 --d-ff 1024 --experts 8
        --top-k 2 --capacity-factor 0 --warmup 2 --iters 7 --threads <os.cpu_count()>] [--autocast-bf16]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

from bench_args import int_in  # bench/, the script's own directory

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))
torch = torch_moe = None  # loaded in __main__ after the flags: --threads must reach OpenBLAS first

AUX_COEF, Z_COEF = 0.01, 0.001


def capacity_factor(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}")
    if not math.isfinite(v) or not 0 <= v <= 1e6:
        raise argparse.ArgumentTypeError(f"must be a finite number in [0, 1e6] (0 = dropless), got {s!r}")
    return v


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--tokens", type=int_in(1, 1 << 22), default=4096)
    p.add_argument("--d-model", type=int_in(1, 1 << 16), default=512)
    p.add_argument("--d-ff", type=int_in(1, 1 << 17), default=1024)
    p.add_argument("--experts", type=int_in(1, 4096), default=8)
    p.add_argument("--top-k", type=int_in(1, 4096), default=2)
    p.add_argument("--capacity-factor", type=capacity_factor, default=0.0)
    p.add_argument("--warmup", type=int_in(0, 100000), default=2)
    p.add_argument("--iters", type=int_in(1, 100000), default=7)
    p.add_argument("--threads", type=int_in(1, 4096), default=os.cpu_count() or 1)
    p.add_argument("--autocast-bf16", action="store_true",
                   help="forward under torch.autocast('cpu', dtype=torch.bfloat16), backward outside it "
                        "(default: float32 throughout)")
    a = p.parse_args()  # argparse prints the error and exits with status 2
    if a.top_k > a.experts:
        p.error("--top-k must not exceed --experts")
    if a.tokens * a.top_k * max(a.d_ff, a.d_model) * 4 > 16e9:
        p.error("shape too large (activations over 16 GB)")
    return a


def precision_name(a):
    """The mode, as the output and the json line name it: fp32, or bf16-autocast."""
    return "bf16-autocast" if a.autocast_bf16 else "fp32"


def init_uniform_(block, gen):
    """Every nn.Linear weight, in module order, from uniform(-a, a), a = sqrt(3 / fan_in): unit-variance
    rows stay unit variance through each projection."""
    with torch.no_grad():
        for m in block.modules():
            if isinstance(m, torch.nn.Linear):
                a = math.sqrt(3.0 / m.in_features)
                m.weight.copy_((torch.rand(m.weight.shape, generator=gen) * 2 - 1) * a)


def main(a):
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}  threads={torch.get_num_threads()} (interop {torch.get_num_interop_threads()})"
          f"  python {sys.version.split()[0]}  cpu_count={os.cpu_count()}")
    print(f"shape: T={a.tokens} d={a.d_model} d_ff={a.d_ff} E={a.experts} k={a.top_k} "
          f"capacity_factor={a.capacity_factor:g} ({'capacity' if a.capacity_factor > 0 else 'dropless'}) "
          f"warmup={a.warmup} iters={a.iters}")
    print(f"precision: {precision_name(a)} ("
          + ("forward under torch.autocast('cpu', dtype=torch.bfloat16), backward outside it; float32 weights"
             if a.autocast_bf16 else "float32 throughout") + ")")

    gen = torch.Generator().manual_seed(0x5EED)
    layer = torch_moe.SparseMoeBlock(a.d_model, a.d_ff, a.experts, a.top_k, score_func="softmax",
                                     renormalize=True, capacity_factor=a.capacity_factor)
    init_uniform_(layer, gen)
    x0 = torch.rand(a.tokens, a.d_model, generator=gen) * 2 - 1
    dout = torch.rand(a.tokens, a.d_model, generator=gen) * 2 - 1

    tf, tb, tt = [], [], []
    for it in range(-a.warmup, a.iters):
        layer.zero_grad(set_to_none=False)  # untimed: a training step zeroes the gradients once
        x = x0.clone().requires_grad_(True)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast_bf16):
            out, aux, z, experts, kept_mask = layer(x)
            loss = (out * dout).sum() + AUX_COEF * aux + Z_COEF * z
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if it >= 0:
            tf.append((t1 - t0) * 1e3), tb.append((t2 - t1) * 1e3), tt.append((t2 - t0) * 1e3)

    T, d, f, E = a.tokens, a.d_model, a.d_ff, a.experts
    counts = torch_moe.expert_counts(experts, E)  # top-k counts, before capacity
    kept = int(kept_mask.sum())
    flop_f = 3 * 2.0 * kept * d * f + 2.0 * T * d * E
    flop_t = 3 * flop_f
    checksum = float(out.detach().double().sum() + x.grad.double().sum())
    print("rows per expert (before capacity):", " ".join(str(int(c)) for c in counts),
          f" (kept {kept} of {T * a.top_k})")
    print(f"losses: aux={aux.item():.6f} z={z.item():.6f}  checksum(out+dx)={checksum:.6e}")
    res = {}
    for name, v, flop in (("forward", tf, flop_f), ("backward", tb, 2 * flop_f), ("total", tt, flop_t)):
        med, mn = statistics.median(v), min(v)
        res[name] = (med, mn)
        print(f"{name:8s}: median {med:8.2f} ms  min {mn:8.2f} ms  {flop / med * 1e-6:7.1f} GFLOP/s")
    rec = {"bench": "moe_layer_torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
           "tokens": T, "d_model": d, "d_ff": f, "experts": E, "top_k": a.top_k,
           "capacity_factor": a.capacity_factor, "precision": precision_name(a),
           "autocast_bf16": a.autocast_bf16, "warmup": a.warmup, "iters": a.iters, "rows": kept,
           "gflop_total": flop_t * 1e-9, "gflops": flop_t / res["total"][0] * 1e-6}
    for name, (med, mn) in res.items():
        rec[f"{name}_ms"] = {"median": round(med, 4), "min": round(mn, 4)}
    print("json: " + json.dumps(rec, separators=(",", ":")))


if __name__ == "__main__":
    args = parse_args()
    # Debian's torch does its float32 GEMMs in OpenBLAS, whose thread count torch.set_num_threads does not set:
    # it is read once, when torch loads it (scripts/mpi_env.sh exports 1)
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    import torch  # noqa: E402
    import torch_moe  # noqa: E402  (tests/torch_moe.py: the layer's math)
    main(args)
