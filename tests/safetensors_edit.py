#!/usr/bin/env python3
"""safetensors_edit.py FILE TENSOR VALUE — sets every element of the F32 tensor TENSOR in the safetensors FILE to
VALUE, in place, and rewrites the tensor's CRC-32C in the header's metadata (checkpoint/safetensors.c keeps one per
tensor, "crc32c:NAME", 8 hex digits), so the file stays valid with the same header length: how the tests make a
checkpoint that is well-formed but holds what training never writes (a negative second moment, an expert at 1e20).
A checkpoint directory's manifest.json binds the header's checksum, so an edited file loads only from a directory
without one (as another tool's checkpoint). Standard library only."""
import json
import struct
import sys


def crc32c(data):
    """CRC-32C (Castagnoli, reflected 0x82F63B78), as checkpoint/checksum.c computes it."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def main():
    path, name, value = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open(path, "rb") as f:
        blob = bytearray(f.read())
    (n,) = struct.unpack("<Q", blob[:8])
    header_text = blob[8:8 + n].decode()
    header = json.loads(header_text)
    t = header[name]
    if t["dtype"] != "F32":
        sys.exit("safetensors_edit: %s is %s, not F32" % (name, t["dtype"]))
    begin, end = (8 + n + o for o in t["data_offsets"])
    count = (end - begin) // 4
    blob[begin:end] = struct.pack("<%df" % count, *([value] * count))
    key = "crc32c:" + name
    old = header.get("__metadata__", {}).get(key)
    if old is not None:
        new = "%08x" % crc32c(bytes(blob[begin:end]))
        marker = '"%s":"%s"' % (key, old)
        if header_text.count(marker) != 1:
            sys.exit("safetensors_edit: cannot find %s in the header" % marker)
        header_text = header_text.replace(marker, '"%s":"%s"' % (key, new))
        blob[8:8 + n] = header_text.encode()
    with open(path, "wb") as f:
        f.write(blob)


if __name__ == "__main__":
    main()
