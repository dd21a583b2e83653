#!/usr/bin/env python3
"""compare_checkpoints.py A B — which tensors of two safetensors files differ, byte for byte.

Prints "N of M tensors differ: NAME ..." (the first ten names, sorted) and exits 1 when any differs, 0 when every
tensor is the same bytes (a tensor missing from B counts as different). Standard library only, so that it runs on
a bare GPU machine. Used by tests/test_gpu_train.sh to name what differs and by scripts/gpu_layouts.sh."""
import json
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        data = f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: compare_checkpoints.py A.safetensors B.safetensors")
    a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
    differ = sorted(k for k in a if a[k] != b.get(k))
    print(f"{len(differ)} of {len(a)} tensors differ" + (": " + " ".join(differ[:10]) if differ else ""))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
