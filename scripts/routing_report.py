#!/usr/bin/python3
"""routing_report.py — what the routers did during a moe-train run, from its JSON-lines metrics file.

    /usr/bin/python3 scripts/routing_report.py RUN/metrics.jsonl --out DIR [--last-fraction 0.1]

Reads the file moe-train writes with --log-file (one object per step with step, aux_loss, z_loss,
drop_fraction and expert_tokens: [{"layer": l, "tokens": [per-expert counts]}]; objects with a "record" key, such
as the run record it opens with, are not steps and are skipped) and writes to DIR:
  expert_load_heatmap.png  per MoE layer, tokens each expert received at each step as a multiple of the
                           mean over the layer's experts (1 = perfectly balanced), one subplot per layer
  drop_fraction.png        fraction of (token, expert) assignments dropped by capacity limits, per step
  aux_loss.png             load-balancing (aux) loss and router z-loss per step
  routing_summary.txt      the lines printed: per layer, over the last 10% of the steps, the most and the
                           least loaded expert, the coefficient of variation of the loads, unused experts
Needs Debian's python3-matplotlib. Exit status 0; 2 for a missing, empty or malformed metrics file (the
message names the line) or bad arguments.
"""
import argparse
import json
import math
import os
import sys


def fail(msg):
    print(f"routing_report: {msg}", file=sys.stderr)
    sys.exit(2)


def number(obj, key, where):
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        fail(f"{where}: '{key}' is missing or not a finite number (got {v!r})")
    return v


def load(path):
    """[{step, aux, z, drop, tokens: {layer: [counts]}}], checked line by line."""
    try:
        f = open(path)
    except OSError as e:
        fail(f"cannot read the metrics file {path}: {e.strerror}")
    rows, layout = [], None
    with f:
        try:
            lines = f.readlines()
        except UnicodeDecodeError:
            fail(f"{path} is not text (a metrics file is JSON lines: moe-train --log-file)")
        for n, line in enumerate(lines, 1):
            where = f"{path}: line {n}"
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{where}, character {e.pos + 1}: not valid JSON ({e.msg.removesuffix(' at')}); is the file "
                     f"truncated or corrupt?")
            if not isinstance(obj, dict):
                fail(f"{where}: expected a JSON object per line")
            if "record" in obj:  # the run record the file opens with, an --eval-only evaluation: not a step
                continue
            step = number(obj, "step", where)
            if rows and step <= rows[-1]["step"]:
                fail(f"{where}: step {step} after step {rows[-1]['step']} (two runs in one file?)")
            per_layer = obj.get("expert_tokens")
            if not isinstance(per_layer, list):
                fail(f"{where}: 'expert_tokens' is missing or not a list")
            tokens = {}
            for entry in per_layer:
                counts = entry.get("tokens") if isinstance(entry, dict) else None
                layer = entry.get("layer") if isinstance(entry, dict) else None
                if not isinstance(layer, int) or not isinstance(counts, list) or not counts or not all(
                        isinstance(c, (int, float)) and not isinstance(c, bool) and c >= 0 for c in counts):
                    fail(f"{where}: each expert_tokens entry needs an integer 'layer' and a list of counts >= 0")
                tokens[layer] = counts
            shape = {l: len(c) for l, c in tokens.items()}
            if layout is None:
                layout = shape
            elif shape != layout:
                fail(f"{where}: layers/experts {shape} differ from the first line's {layout}")
            rows.append({"step": step, "aux": number(obj, "aux_loss", where), "z": number(obj, "z_loss", where),
                         "drop": number(obj, "drop_fraction", where), "tokens": tokens})
    if not rows:
        fail(f"{path} holds no step's metrics (an empty file, or a run that logged no step)")
    return rows, layout


def summary_lines(rows, layout, fraction):
    n = max(1, math.ceil(fraction * len(rows)))
    window = rows[-n:]
    first, last = window[0]["step"], window[-1]["step"]
    lines = []
    for layer in sorted(layout):
        E = layout[layer]
        total = [sum(r["tokens"][layer][e] for r in window) for e in range(E)]
        mean = sum(total) / E
        if mean == 0:
            lines.append(f"layer {layer} (steps {first}-{last}): no tokens routed")
            continue
        ratio = [t / mean for t in total]
        cv = math.sqrt(sum((x - 1) ** 2 for x in ratio) / E)
        hi = max(range(E), key=lambda e: (ratio[e], -e))
        lo = min(range(E), key=lambda e: (ratio[e], e))
        unused = [str(e) for e in range(E) if total[e] == 0]
        lines.append(f"layer {layer} (steps {first}-{last}, {E} experts): most loaded expert {hi} "
                     f"({ratio[hi]:.2f}x mean, {total[hi] / sum(total):.1%} of assignments), least loaded expert "
                     f"{lo} ({ratio[lo]:.2f}x mean, {total[lo] / sum(total):.1%}), cv {cv:.3f}, unused: "
                     f"{' '.join(unused) if unused else 'none'}")
    return lines


def plot(rows, layout, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.colors
    import matplotlib.pyplot as plt
    steps = [r["step"] for r in rows]
    written = []
    if layout:
        layers = sorted(layout)
        cols = 1 if len(layers) == 1 else 2
        nrows = math.ceil(len(layers) / cols)
        height = 2.2 + (1.2 + 0.12 * max(layout.values())) * nrows  # taller rows for many experts
        fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, height), squeeze=False)
        images, vmax = [], 0
        for layer in layers:
            E = layout[layer]
            grid = []
            for e in range(E):
                grid.append([r["tokens"][layer][e] / (sum(r["tokens"][layer]) / E) if sum(r["tokens"][layer]) else 0
                             for r in rows])
            images.append(grid)
            vmax = max(vmax, max(max(g) for g in grid))
        vmax = min(max(vmax, 2.0), 4.0)  # loads above 4x the mean saturate
        for i, layer in enumerate(layers):
            ax = axes[i // cols][i % cols]
            E = layout[layer]
            norm = matplotlib.colors.TwoSlopeNorm(vmin=0, vcenter=1, vmax=vmax)  # white: balanced
            im = ax.imshow(images[i], aspect="auto", interpolation="nearest", cmap="RdBu_r", norm=norm,
                           origin="lower", extent=(steps[0] - 0.5, steps[-1] + 0.5, -0.5, E - 0.5))
            ax.set_title(f"layer {layer}")
            ax.set_xlabel("step")
            ax.set_ylabel("expert")
            if E <= 16:
                ax.set_yticks(range(E))
            fig.colorbar(im, ax=ax, label="tokens / mean")
        for j in range(len(layers), nrows * cols):
            axes[j // cols][j % cols].axis("off")
        fig.suptitle("tokens per expert / the layer's mean (red: overloaded, blue: underloaded)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "expert_load_heatmap.png"), dpi=90)
        written.append("expert_load_heatmap.png")
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(steps, [100 * r["drop"] for r in rows], lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("dropped assignments (%)")
    ax.set_title("capacity drops per step")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "drop_fraction.png"), dpi=90)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in ((axes[0], "aux", "load-balancing (aux) loss"), (axes[1], "z", "router z-loss")):
        ax.plot(steps, [r[key] for r in rows], lw=1)
        ax.set_title(title + " (unweighted)")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "aux_loss.png"), dpi=90)
    plt.close("all")
    return written + ["drop_fraction.png", "aux_loss.png"]


def main():
    p = argparse.ArgumentParser(description="Routing report (expert loads, drops, aux loss) from moe-train metrics.")
    p.add_argument("metrics", help="the JSON-lines file of moe-train --log-file")
    p.add_argument("--out", required=True, help="directory for the PNGs and routing_summary.txt")
    p.add_argument("--last-fraction", type=float, default=0.1, help="summary over this last fraction of the steps")
    a = p.parse_args()
    if not 0 < a.last_fraction <= 1:
        fail("--last-fraction must be in (0, 1]")
    rows, layout = load(a.metrics)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        fail("needs matplotlib for Debian's python3 (apt-get install python3-matplotlib)")
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        fail(f"cannot create --out {a.out}: {e.strerror or e}")
    lines = summary_lines(rows, layout, a.last_fraction) if layout else [
        "no MoE layers in this run (dense): no expert loads to report"]
    lines.append(f"steps {rows[0]['step']}-{rows[-1]['step']}: mean drop fraction "
                 f"{sum(r['drop'] for r in rows) / len(rows):.2%}, aux loss {rows[0]['aux']:.4f} at the first step, "
                 f"{rows[-1]['aux']:.4f} at the last")
    for line in lines:
        print(line)
    with open(os.path.join(a.out, "routing_summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    written = plot(rows, layout, a.out)
    print(f"routing_report: wrote {', '.join(written)} and routing_summary.txt to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
