#!/usr/bin/env python3
"""fp8_blocks.py SRC FP8 REF [BLOCK_ROWS BLOCK_COLS [DROP [PLAIN]]] — a moe-train DeepSeek-V3 checkpoint (SRC: config.json and
an F32 model.safetensors) made into what DeepSeek releases, and the weights that release means:

  FP8  every projection matrix (*_proj.weight) in F8_E4M3, scaled per block of BLOCK_ROWS x BLOCK_COLS as DeepSeek-V3's
       quantization does (s = amax(block) / 448 in float32, stored as NAME_scale_inv; the value x / s rounded to the
       nearest E4M3, ties to even), the rest as they are; config.json with quantization_config (fp8, e4m3, the block)
       and num_nextn_predict_layers 1 with that module's tensors (model.layers.L.*) beside the model's; two shards and
       an index, the scales in the second shard, apart from their weights;
  REF  the same model in F32 as the FP8 files mean it: each value decode(code) x s rounded once to float32.

So moe-train --init-from FP8 must give --init-from REF's bits. DROP: a scale's name left out of FP8 (a broken release;
'' for none); PLAIN: a weight's name stored in F32 beside its scale (another broken one: the scale would go unused).
Standard library only (the E4M3 values by formula, a nearest search over them): the check does not share moe-train's
decoder."""
import bisect
import json
import os
import re
import struct
import sys

E4M3_MAX = 448.0


def e4m3_value(code):
    """The OCP E4M3 value of a non-negative code below 127 (127 is NaN)."""
    e, m = code >> 3, code & 7
    return (1 + m / 8) * 2.0 ** (e - 7) if e else m / 8 * 2.0 ** -6


POSITIVE = [e4m3_value(c) for c in range(127)]  # increasing with the code


def e4m3_code(x):
    """x (|x| <= 448) to the nearest E4M3 code, ties to the even code."""
    a = abs(x)
    i = bisect.bisect_left(POSITIVE, a)
    if i == len(POSITIVE):
        i -= 1
    elif i > 0 and (a - POSITIVE[i - 1] < POSITIVE[i] - a or
                    (a - POSITIVE[i - 1] == POSITIVE[i] - a and (i - 1) % 2 == 0)):
        i -= 1
    return i | (0x80 if x < 0 or (x == 0 and str(x).startswith("-")) else 0)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", f"{name}: {t['dtype']} (an F32 checkpoint is expected)"
        b, e = t["data_offsets"]
        data = blob[8 + n + b:8 + n + e]
        out[name] = (t["shape"], list(struct.unpack(f"<{len(data) // 4}f", data)))
    return out


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)}"""
    header, offset, chunks = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def main():
    src, fp8_dir, ref_dir = sys.argv[1:4]
    b0, b1 = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (128, 128)
    drop = sys.argv[6] if len(sys.argv) > 6 else None
    plain = sys.argv[7] if len(sys.argv) > 7 else None
    config = json.load(open(os.path.join(src, "config.json")))
    weights = read_safetensors(os.path.join(src, "model.safetensors"))
    layers = config["num_hidden_layers"]
    shard1, shard2, ref = {}, {}, {}
    for name, (shape, values) in weights.items():
        f32_bytes = lambda v: struct.pack(f"<{len(v)}f", *v)
        if not (re.search(r"_proj\.weight$", name) and len(shape) == 2):
            shard1[name] = ("F32", shape, f32_bytes(values))
            ref[name] = ("F32", shape, f32_bytes(values))
            continue
        rows, cols = shape
        grid = ((rows + b0 - 1) // b0, (cols + b1 - 1) // b1)
        codes, dequant, scales = bytearray(rows * cols), [0.0] * (rows * cols), []
        for bi in range(grid[0]):
            for bj in range(grid[1]):
                cells = [i * cols + j for i in range(bi * b0, min(rows, (bi + 1) * b0))
                         for j in range(bj * b1, min(cols, (bj + 1) * b1))]
                amax = max(abs(values[c]) for c in cells)
                s = f32(amax / E4M3_MAX) if amax > 0 else 1.0
                scales.append(s)
                for c in cells:
                    code = e4m3_code(max(-E4M3_MAX, min(E4M3_MAX, values[c] / s)))
                    codes[c] = code
                    dequant[c] = f32((-1 if code & 0x80 else 1) * e4m3_value(code & 0x7F) * s)
        shard1[name] = ("F32", shape, f32_bytes(values)) if name == plain else ("F8_E4M3", shape, bytes(codes))
        shard2[name + "_scale_inv"] = ("F32", list(grid), f32_bytes(scales))
        ref[name] = ("F32", shape, f32_bytes(dequant))
    # a multi-token prediction module as layer L (skipped on load, as transformers skips it)
    if drop:
        del shard2[drop]
    shard2[f"model.layers.{layers}.eh_proj.weight"] = ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4))
    for d in (fp8_dir, ref_dir):
        os.makedirs(d, exist_ok=True)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    write_safetensors(os.path.join(fp8_dir, names[0]), shard1)
    write_safetensors(os.path.join(fp8_dir, names[1]), shard2)
    index = {"metadata": {}, "weight_map": {**{k: names[0] for k in shard1}, **{k: names[1] for k in shard2}}}
    json.dump(index, open(os.path.join(fp8_dir, "model.safetensors.index.json"), "w"), indent=1)
    json.dump({**config, "num_nextn_predict_layers": 1,
               "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                       "weight_block_size": [b0, b1]}},
              open(os.path.join(fp8_dir, "config.json"), "w"), indent=1)
    write_safetensors(os.path.join(ref_dir, "model.safetensors"), ref)
    json.dump(config, open(os.path.join(ref_dir, "config.json"), "w"), indent=1)
    quantized = sum(1 for v in shard1.values() if v[0] == "F8_E4M3")
    print(f"fp8_blocks.py: {quantized} of {len(weights)} tensors in F8_E4M3, blocks {b0} x {b1}")


if __name__ == "__main__":
    main()
