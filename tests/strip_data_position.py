#!/usr/bin/env python3
"""strip_data_position.py STEP_DIR [KEY=VALUE] — makes STEP_DIR's checkpoint look as moe-train wrote it before issue
52: its train_state.safetensors without the data position's metadata (every "data_*" key); with KEY=VALUE, that
metadata key set to VALUE instead (a damaged position). The manifest's size and header checksum of that file are
updated to match, so that the directory is well-formed and loads (test_data_cli.sh resumes it). Standard library only;
the CRC-32C is safetensors_edit.py's."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_edit import crc32c  # noqa: E402


def main():
    step_dir = sys.argv[1]
    path = os.path.join(step_dir, "train_state.safetensors")
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    meta = header["__metadata__"]
    if len(sys.argv) > 2:
        key, value = sys.argv[2].split("=", 1)
        assert key in meta, f"{path}: no metadata key {key}"
        meta[key] = value
        dropped = []
    else:
        dropped = [k for k in meta if k.startswith("data_")]
        assert dropped, f"{path}: no data_* metadata to strip"
    for k in dropped:
        del meta[k]
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the header's length a multiple of 8, as the writer keeps it
    head = struct.pack("<Q", len(text)) + text
    with open(path, "wb") as f:
        f.write(head + blob[8 + n:])
    manifest_path = os.path.join(step_dir, "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["files"]["train_state.safetensors"] = len(head) + len(blob) - 8 - n
    manifest["header_crc32c"]["train_state.safetensors"] = f"{crc32c(head):08x}"
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"{path}: set {sys.argv[2]}" if len(sys.argv) > 2 else
          f"{path}: dropped {len(dropped)} keys ({', '.join(sorted(dropped))})")


if __name__ == "__main__":
    main()
