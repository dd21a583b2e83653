#!/usr/bin/python3
"""sweep_experts.py — trains moe-train for a list of expert counts at the same ACTIVE parameters, then
tabulates and plots the results.

    /usr/bin/python3 scripts/sweep_experts.py --experts-list 1 2 4 8 16 --steps 300 --out /tmp/sweep \
        [--top-k 2] [--d-ff-active 512] [--ranks 2] [--ep 1] [--top-k-list 1 2] [--capacity-factors 0 1.25] \
        [-- extra moe-train flags]

scripts/sweep_experts.sh installs what is missing, builds and prepares the data first. Each expert has
d_ff = d_ff_active / k, so every token uses d_ff_active hidden units whatever E is; E = 1 is the dense
baseline (k = 1, d_ff = d_ff_active). Each run has OUT/runs/<name>/ (metrics.jsonl, stdout.log, stderr.log,
peak_rss_kb, and a `done` marker written only after it succeeded); a rerun skips the runs whose marker holds
the same flags, so an interrupted sweep resumes where it stopped (an unfinished run starts over).
Peak memory: runs launch as `mpirun -np R /usr/bin/time -a -o RUN/peak_rss_kb -f %M moe-train ...` (with
scripts/mpi_env.sh's environment); GNU time (Debian package `time`) appends each rank's peak resident set
size in KB, one line per rank, and the table shows the largest. Results: OUT/sweep.csv, OUT/sweep.md,
OUT/val_loss_vs_experts.png, OUT/throughput_vs_experts.png, OUT/loss_curves.png.
Exit status: 0 every run done, 1 a run failed (the others are still tabulated), 2 bad usage.
"""
import argparse
import csv
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GNU_TIME = "/usr/bin/time"
OWNED = {"--experts", "--top-k", "--d-ff", "--ep", "--capacity-factor", "--steps", "--log-file", "--train-data",
         "--val-data"}  # set per run (moe-train refuses a flag given twice)
DEFAULTS = {"--sample-tokens": "0"}  # the sweep's defaults, unless the flags after -- give them
COLUMNS = ["run", "experts", "top_k", "d_ff", "capacity_factor", "ep", "ranks", "steps", "dense_params",
           "expert_params", "final_val_loss", "best_val_loss", "best_val_step", "mean_tokens_per_s",
           "median_tokens_per_s", "mean_step_ms", "median_step_ms", "peak_rss_mb", "final_load_min", "final_load_max",
           "final_load_cv", "mean_drop_fraction", "wall_s"]
MD_COLUMNS = [("run", "run"), ("experts", "E"), ("top_k", "k"), ("d_ff", "d_ff"), ("capacity_factor", "cf"),
              ("expert_params", "expert params/rank"), ("final_val_loss", "final val"), ("best_val_loss", "best val"),
              ("mean_tokens_per_s", "tok/s"), ("median_tokens_per_s", "median tok/s"), ("mean_step_ms", "ms/step"),
              ("peak_rss_mb", "peak RSS MB"), ("final_load_min", "load min"), ("final_load_max", "load max"),
              ("final_load_cv", "load cv"), ("mean_drop_fraction", "drop")]
MD_FORMATS = {"mean_drop_fraction": "{:.2%}", "mean_step_ms": "{:.1f}", "median_step_ms": "{:.1f}",
              "mean_tokens_per_s": "{:,.0f}", "median_tokens_per_s": "{:,.0f}", "peak_rss_mb": "{:.1f}",
              "expert_params": "{:,}", "final_load_min": "{:.2f}", "final_load_max": "{:.2f}",
              "final_load_cv": "{:.3f}"}


def die(msg):
    print(f"sweep_experts: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv):
    extra = []
    if "--" in argv:
        argv, extra = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    p = argparse.ArgumentParser(description="Expert-count sweep of moe-train at equal active parameters.",
                                epilog="Flags after `--` go to moe-train unchanged (see moe-train --help).")
    p.add_argument("--experts-list", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32], help="E = 1: dense")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--top-k-list", type=int, nargs="+", help="sweep these k (instead of --top-k)")
    p.add_argument("--capacity-factors", type=float, nargs="+", help="sweep these (<= 0: dropless; "
                   "default: moe-train's default)")
    p.add_argument("--d-ff-active", type=int, default=512, help="hidden units each token uses (k x d_ff)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size (divides --ranks and E)")
    p.add_argument("--out", default="sweep_out")
    p.add_argument("--train-data", default=os.path.join(ROOT, "data", "kjv_train.bin"))
    p.add_argument("--val-data", default=os.path.join(ROOT, "data", "kjv_val.bin"))
    p.add_argument("--moe-train", default=os.path.join(os.environ.get("MOE_BUILD_DIR", os.path.join(ROOT, "build")),
                                                       "moe-train"))
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--no-plots", action="store_true")
    a = p.parse_args(argv)
    a.extra = extra
    a.train_data, a.val_data = os.path.abspath(a.train_data), os.path.abspath(a.val_data)
    for flag in extra:
        if flag.split("=", 1)[0] in OWNED:  # --flag value and --flag=value alike (the latter slipped past: a probe)
            die(f"{flag} is set by the sweep; use the sweep's own option instead of passing it after --")
    if min(a.ranks, a.ep, a.steps, a.d_ff_active, a.top_k, *a.experts_list, *(a.top_k_list or [1])) < 1:
        die("--ranks, --ep, --steps, --d-ff-active, expert counts and k must be positive")
    if a.ranks % a.ep:
        die(f"--ep {a.ep} must divide --ranks {a.ranks}")
    if not a.no_plots and importlib.util.find_spec("matplotlib") is None:  # before the runs, not a traceback after
        die(f"the plots need matplotlib, which {sys.executable} cannot import (apt-get install python3-matplotlib "
            "for Debian's python3, or pip): install it, or give --no-plots")
    return a


def number(x):
    """x as short as it reads back exactly: 1.25, 1.000001 (%g alone gave 1 for 1.000001: its run was never made)"""
    s = f"{x:g}"
    return s if float(s) == x else repr(x)


def plan_runs(a):
    """[(name, E, k, d_ff, cf, ep)] in sweep order; impossible combinations are skipped with a message."""
    runs, said = {}, set()

    def skip(msg):
        if msg not in said:
            said.add(msg)
            print(f"sweep_experts: skipping {msg}")
    for E in a.experts_list:
        for k in a.top_k_list or [a.top_k]:
            for cf in a.capacity_factors or [None]:
                if E == 1:  # dense: one FFN of d_ff_active; k, cf and ep mean nothing here
                    run = (f"E1_dense_dff{a.d_ff_active}", 1, 1, a.d_ff_active, None, 1)
                elif k > E:
                    skip(f"E={E} k={k}: k exceeds the number of experts")
                    continue
                elif a.d_ff_active % k:
                    skip(f"E={E} k={k}: --d-ff-active {a.d_ff_active} is not a multiple of k")
                    continue
                elif E % a.ep:
                    skip(f"E={E}: --ep {a.ep} does not divide the number of experts")
                    continue
                else:
                    dff = a.d_ff_active // k
                    name = f"E{E}_k{k}_dff{dff}" + (f"_cf{number(cf)}" if cf is not None else "") + \
                        (f"_ep{a.ep}" if a.ep > 1 else "")
                    run = (name, E, k, dff, cf, a.ep)
                runs.setdefault(run[0], run)
    return list(runs.values())


def given(a, flag):
    """whether the flags after -- give flag, as `--flag value` or `--flag=value` (a probe: `--warmup=2` was added to
    and moe-train refused it as given twice)"""
    return any(word == flag or word.startswith(flag + "=") for word in a.extra)


def moe_train_args(a, run):
    """(what identifies the run: must match for a rerun to skip it, the full moe-train flags)"""
    name, E, k, dff, cf, ep = run
    args = ["--train-data", a.train_data, "--val-data", a.val_data, "--steps", str(a.steps),
            "--experts", str(E), "--top-k", str(k), "--d-ff", str(dff), "--ep", str(ep)]
    args += [word for flag, value in DEFAULTS.items() if not given(a, flag) for word in (flag, value)]
    if not given(a, "--warmup"):  # what docs/SWEEPS.md measured with; the trainer's default is min(100, steps / 10)
        args += ["--warmup", str(min(100, a.steps))]
    args += (["--capacity-factor", number(cf)] if cf is not None else []) + a.extra
    return {"ranks": a.ranks, "moe_train_args": args}, args + ["--log-file", run_file(a, run, "metrics.jsonl")]


def run_file(a, run, name):
    return os.path.join(a.out, "runs", run[0], name)


def is_done(a, run):
    """True when the run finished earlier with the same flags and its results read back whole; one whose files were
    damaged since runs again (said so); one finished with other flags stops the sweep."""
    marker = run_file(a, run, "done")
    if not os.path.exists(marker):
        return False
    try:
        with open(marker) as f:
            old = json.load(f)
        if not isinstance(old, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        return damaged(run, f"{marker}: {e}")
    if {"ranks": old.get("ranks"), "moe_train_args": old.get("moe_train_args")} != moe_train_args(a, run)[0]:
        die(f"{os.path.dirname(marker)} holds a finished run with other flags; use another --out or remove that "
            f"directory")
    try:
        rows = read_metrics(run_file(a, run, "metrics.jsonl"))
        with open(run_file(a, run, "stdout.log")):
            pass
    except (OSError, ValueError) as e:
        return damaged(run, str(e))
    if not rows or rows[-1].get("step") != a.steps:
        return damaged(run, f"its metrics.jsonl holds {len(rows)} of {a.steps} steps")
    return True


def damaged(run, why):
    print(f"sweep_experts: {run[0]}: its results are damaged ({why}): running it again", file=sys.stderr)
    return False


def read_metrics(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                rows += [json.loads(line)] if line.strip() else []
                # the run record the file opens with, an eval record: not a step; a dropped step (--skip-nonfinite):
                # no loss to plot (null where it was not finite)
                if rows and ("record" in rows[-1] or rows[-1].get("skipped")):
                    rows.pop()
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n}: {e}") from None
    return rows


def run_one(a, env, run):
    identity, args = moe_train_args(a, run)
    os.makedirs(os.path.dirname(run_file(a, run, "done")), exist_ok=True)
    rss_file = run_file(a, run, "peak_rss_kb")
    if os.path.exists(rss_file):
        os.remove(rss_file)
    # one short O_APPEND write per rank: unlike the ranks' stderr, lines do not interleave
    timer = [GNU_TIME, "-a", "-o", rss_file, "-f", "%M"] if os.access(GNU_TIME, os.X_OK) else []
    if not timer:
        print(f"sweep_experts: no {GNU_TIME} (Debian package `time`): peak memory not measured", file=sys.stderr)
    cmd = [a.mpirun, "-np", str(a.ranks)] + timer + [a.moe_train] + args
    print(f"sweep_experts: run {run[0]}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    with open(run_file(a, run, "stdout.log"), "w") as so, open(run_file(a, run, "stderr.log"), "w") as se:
        rc = subprocess.run(cmd, stdout=so, stderr=se, env=env).returncode
    wall, rows = time.time() - t0, []
    try:
        rows = read_metrics(run_file(a, run, "metrics.jsonl")) if rc == 0 else []
    except (OSError, ValueError) as e:
        print(f"sweep_experts: {e}", file=sys.stderr)
    if rc != 0 or not rows or rows[-1].get("step") != a.steps:
        with open(run_file(a, run, "stderr.log")) as f:
            tail = f.read().splitlines()[-15:]
        print(f"sweep_experts: run {run[0]} FAILED (exit {rc}, {len(rows)} of {a.steps} steps logged); its "
              f"stderr.log ends with:\n  " + "\n  ".join(tail), file=sys.stderr)
        return False
    rss = []
    if timer:
        with open(rss_file) as f:
            rss = [int(x) for x in f.read().split()]
    with open(run_file(a, run, "done.tmp"), "w") as f:
        json.dump({**identity, "command": cmd, "wall_s": round(wall, 1), "peak_rss_kb_per_rank": rss}, f)
    os.replace(run_file(a, run, "done.tmp"), run_file(a, run, "done"))
    print(f"sweep_experts: {run[0]} done in {wall:.0f} s", flush=True)
    return True


def summarize(a, run):
    name, E, k, dff, cf, ep = run
    with open(run_file(a, run, "done")) as f:
        done = json.load(f)
    rows = read_metrics(run_file(a, run, "metrics.jsonl"))
    with open(run_file(a, run, "stdout.log")) as f:
        text = f.read()
    config = dict(re.findall(r"^  (--[a-z-]+) +(\S.*)$", text, re.M))  # moe-train prints every flag's value
    params = re.search(r"(\d+) dense \+ (\d+) expert parameters per rank", text)
    vals = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    best = min(vals, key=lambda v: v[1]) if vals else (None, math.nan)
    timed = rows[1:] or rows  # step 1 carries one-off set-up costs
    ms, tps = sorted(r["ms"] for r in timed), sorted(r["tokens_per_s"] for r in timed)
    rss = done.get("peak_rss_kb_per_rank") or []
    mean = lambda xs: sum(xs) / len(xs)
    return {"run": name, "experts": E, "top_k": k, "d_ff": dff, "ep": ep, "ranks": done["ranks"],
            "capacity_factor": "-" if E == 1 else config.get("--capacity-factor", ""),  # dense: no capacity
            "steps": rows[-1]["step"], "dense_params": int(params.group(1)) if params else "",
            "expert_params": int(params.group(2)) if params else "",
            "final_val_loss": vals[-1][1] if vals else math.nan, "best_val_loss": best[1], "best_val_step": best[0],
            "mean_tokens_per_s": mean(tps), "median_tokens_per_s": tps[len(tps) // 2], "mean_step_ms": mean(ms),
            "median_step_ms": ms[len(ms) // 2],
            "peak_rss_mb": max(rss) / 1024 if rss else math.nan, "final_load_min": rows[-1]["load_min"],
            "final_load_max": rows[-1]["load_max"], "final_load_cv": rows[-1]["load_cv"],
            "mean_drop_fraction": mean([r["drop_fraction"] for r in rows]), "wall_s": done.get("wall_s", "")}, rows


def write_tables(out, results):
    with open(os.path.join(out, "sweep.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in results:
            w.writerow({c: f"{r[c]:.6g}" if isinstance(r[c], float) else r[c] for c in COLUMNS})
    fmt = lambda c, v: "" if v in ("", None) else MD_FORMATS.get(c, "{:.4f}" if isinstance(v, float) else "{}") \
        .format(v)
    with open(os.path.join(out, "sweep.md"), "w") as f:
        f.write("| " + " | ".join(h for _, h in MD_COLUMNS) + " |\n")
        f.write("|" + "|".join("---" if c == "run" else "---:" for c, _ in MD_COLUMNS) + "|\n")
        for r in results:
            f.write("| " + " | ".join(fmt(c, r[c]) for c, _ in MD_COLUMNS) + " |\n")


def plot(out, results, curves):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    series = {}
    for r in results:
        series.setdefault("dense" if r["experts"] == 1 else f"k={r['top_k']}, cf={r['capacity_factor']}", []).append(r)
    dense = series.pop("dense", [None])[0]

    def by_experts(ax, field, label, title):
        for key, rs in series.items():
            rs = sorted(rs, key=lambda r: r["experts"])
            ax.plot([r["experts"] for r in rs], [r[field] for r in rs], "o-", label=key)
        if dense:
            ax.axhline(dense[field], color="gray", ls="--", lw=1)
            ax.plot([1], [dense[field]], "ks", label="dense (E=1)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["experts"] for r in results}))
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set(xlabel="experts E (same active parameters per token)", ylabel=label, title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    by_experts(ax, "final_val_loss", "validation loss at the last step (nats/byte)", "validation loss vs experts")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "val_loss_vs_experts.png"), dpi=90)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    by_experts(axes[0], "median_tokens_per_s", "training tokens/s (median over steps)", "throughput")
    by_experts(axes[1], "peak_rss_mb", "peak RSS, largest rank (MB)", "memory")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput_vs_experts.png"), dpi=90)
    # training loss, validation loss, and (with a dense run) training loss minus the dense run's at the same
    # step: every run sees the same batches, so the difference removes most of the batch-to-batch noise
    base = {x["step"]: x["loss"] for x in curves[dense["run"]]} if dense else {}
    fig, axes = plt.subplots(1, 3 if base else 2, figsize=(16 if base else 11, 4.2))
    w = max(1, max(len(rows) for rows in curves.values()) // 30)  # moving average over w steps
    smooth = lambda v: [sum(v[max(0, i - w + 1):i + 1]) / (i + 1 - max(0, i - w + 1)) for i in range(len(v))]
    for i, r in enumerate(results):
        rows, style = curves[r["run"]], {"lw": 1, "label": r["run"], "color": f"C{i % 10}"}
        axes[0].plot([x["step"] for x in rows], smooth([x["loss"] for x in rows]), **style)
        vals = [(x["step"], x["val_loss"]) for x in rows if "val_loss" in x]
        axes[1].plot([v[0] for v in vals], [v[1] for v in vals], "o-", ms=3, **style)
        if base and r is not dense:
            same = [x for x in rows if x["step"] in base]
            axes[2].plot([x["step"] for x in same], smooth([x["loss"] - base[x["step"]] for x in same]), **style)
    axes[0].set(title=f"training loss (moving average over {w} steps)", ylabel="loss (nats/byte)")
    axes[1].set(title="validation loss", ylabel="loss (nats/byte)")
    if base:
        axes[2].axhline(0, color="gray", ls="--", lw=1)
        axes[2].set(title=f"training loss minus dense's (average over {w} steps)", ylabel="difference (nats/byte)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    lo = min(min(x["loss"] for x in rows) for rows in curves.values())
    axes[0].set_ylim(lo - 0.05, lo + 1.5)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss_curves.png"), dpi=90)
    plt.close("all")


def main():
    a = parse_args(sys.argv[1:])
    for path, what in ((a.train_data, "--train-data"), (a.val_data, "--val-data")):
        if not os.path.isfile(path):
            die(f"{what} {path} does not exist (scripts/prepare_data.sh makes the default data set)")
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        die(f"--out {a.out} exists and is not a directory")
    if not os.access(a.moe_train, os.X_OK):
        die(f"--moe-train {a.moe_train} is not an executable (build first: scripts/setup.sh)")
    runs = plan_runs(a)
    if not runs:
        die("nothing to run")
    finished = {r[0] for r in runs if is_done(a, r)}  # every marker is checked before anything runs
    for r in runs:
        if r[0] in finished:
            print(f"sweep_experts: skip {r[0]} (done)")
    env = {**os.environ, **dict(item.split("=", 1) for item in subprocess.run(  # whatever mpi_env.sh exports
        ["bash", "-c", 'source "$1" && env -0', "_", os.path.join(ROOT, "scripts", "mpi_env.sh")],
        check=True, capture_output=True).stdout.decode().split("\0") if "=" in item)}
    failed = [r[0] for r in runs if r[0] not in finished and not run_one(a, env, r)]
    results, curves = [], {}
    for r in runs:
        if r[0] not in failed:
            s, curves[r[0]] = summarize(a, r)
            results.append(s)
    if results:
        write_tables(a.out, results)
        if not a.no_plots:
            plot(a.out, results, curves)
        with open(os.path.join(a.out, "sweep.md")) as f:
            print(f.read(), end="")
        print(f"sweep_experts: {len(results)} runs in {a.out}: sweep.csv, sweep.md" +
              ("" if a.no_plots else ", val_loss_vs_experts.png, throughput_vs_experts.png, loss_curves.png"))
    if failed:
        print(f"sweep_experts: {len(failed)} run(s) failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
