#!/usr/bin/python3
"""plan_inputs.py — moe-plan's inputs from what bench/ measures on this machine, for scripts/plan_vs_measured.sh and
scripts/two_node_experiment.sh (docs/SCALING.md). Arithmetic only: the scripts run the benches.

  plan_inputs.py alltoall FILE RANKS [BYTES]
      FILE: bench_alltoall's json lines. Prints "latency_us bandwidth_GBps" of Hockney's model
      t = latency + bytes to peers / bandwidth, fitted to every size by least squares of the relative error (so that
      no one size, small or large, decides it); with BYTES also the bench's time for an exchange of BYTES, scaled
      from its nearest size.
  plan_inputs.py rates DIR RANKS CORES
      DIR holds before.dense, after.dense (bench_model_dense's json) and before.layer, after.layer
      (bench_moe_layer's, or {} for a model without MoE layers), measured before and after the run predicted. Prints
      "gflops overhead us_per_token ns_per_param" from the benches' medians, the same four from their minima, and
      the drift: how far before and after were apart (the largest relative difference of the dense time and the
      GEMM rate). Each is the mean of before and after; RANKS on fewer CORES take turns, so each rank gets
      CORES / RANKS of the GEMM rate and RANKS / CORES of the measured times. overhead: the layer's time over its
      GEMM floor, minus 1 (moe-plan --non-gemm-overhead); without a layer the GEMM rate prices nothing (1, 0).
  plan_inputs.py skew SKEW RANKS CORES
      The skew to give moe-plan (--routing-skew) for RANKS ranks on fewer CORES, whose per-rank rates `rates`
      already scaled by CORES / RANKS, when the busiest EP rank has SKEW x the mean expert work. Linux's fair
      scheduler shares the cores equally among the runnable ranks (kernel Documentation/scheduler/
      sched-design-CFS.rst: an "ideal, precise multi-tasking CPU"): all RANKS progress at CORES / RANKS of a core
      until the others (work l = (RANKS - SKEW) / (RANKS - 1) of the mean each) are done, then the busiest runs
      alone on one core: T = l RANKS / CORES + (SKEW - l), over the balanced T0 = RANKS / CORES. SKEW itself when
      every rank has a core.
"""
import json
import sys


def hockney(rows, ranks):
    """(latency_us, us_per_byte): minimise sum ((a + b x - t) / t)^2, the 2 x 2 normal equations in closed form"""
    u = [(1 / r["moe_us"], r["size_bytes"] * (ranks - 1) / ranks / r["moe_us"]) for r in rows]
    s11, s12, s22 = sum(p * p for p, _ in u), sum(p * q for p, q in u), sum(q * q for _, q in u)
    r1, r2 = sum(p for p, _ in u), sum(q for _, q in u)
    det = s11 * s22 - s12 * s12
    return max(0.0, (r1 * s22 - r2 * s12) / det), (s11 * r2 - s12 * r1) / det


def alltoall(path, ranks, size=None):
    rows = [json.loads(line) for line in open(path)]
    if len({r["size_bytes"] for r in rows}) < 2:
        sys.exit(f"plan_inputs.py: {path} holds {len(rows)} bench_alltoall rows; the fit needs two sizes or more")
    latency, per_byte = hockney(rows, int(ranks))
    out = [latency, 1e-3 / per_byte]
    if size is not None:
        near = min(rows, key=lambda r: abs(r["size_bytes"] - int(size)))
        out.append(near["moe_us"] * int(size) / near["size_bytes"])
    print(*out)


def rates(directory, ranks, cores):
    share = min(1.0, int(cores) / int(ranks))  # each rank's share of the cores
    load = lambda tag, kind: json.load(open(f"{directory}/{tag}.{kind}"))
    db, da, lb, la = load("before", "dense"), load("after", "dense"), load("before", "layer"), load("after", "layer")
    mean = lambda a, b: (a + b) / 2
    drift = lambda a, b: abs(a - b) / mean(a, b)
    moved = drift(db["dense_us_per_token"], da["dense_us_per_token"])
    out = []
    for stat in "median", "min":
        per_token = lambda j: j["dense_ms"][stat] * 1e3 / j["tokens"]
        per_param = lambda j: j["optimizer_ms"][stat] * 1e6 / j["params"]
        us, ns = mean(per_token(db), per_token(da)) / share, mean(per_param(db), per_param(da)) / share
        if lb:
            over = lambda j: max(0, j["total_ms"][stat] / j["floor_ms"]["total"] - 1)
            gf, ov = mean(lb["gemm_gflops"], la["gemm_gflops"]) * share, mean(over(lb), over(la))
            moved = max(moved, drift(lb["gemm_gflops"], la["gemm_gflops"]))
        else:
            gf, ov = 1.0, 0.0
        out += [gf, ov, us, ns]
    print(*out, moved)


def skew(busiest, ranks, cores):
    s, W, C = float(busiest), int(ranks), int(cores)
    if W <= C:
        print(s)
        return
    others = (W - s) / (W - 1)
    print((others * W / C + s - others) / (W / C))


if __name__ == "__main__":
    commands = {"alltoall": alltoall, "rates": rates, "skew": skew}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
