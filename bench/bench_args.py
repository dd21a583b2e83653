"""bench_args.py — what the Python benchmarks share of their flag parsing (bench_moe_layer_torch.py,
bench_train_torch.py): integer flags with their range checked, refused with a reason as the C programs do."""
import argparse


def int_in(lo, hi):
    """An argparse type: a base-10 integer in [lo, hi]."""
    def parse(s):
        try:
            v = int(s, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {s!r}")
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}], got {v}")
        return v
    return parse
