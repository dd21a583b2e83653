#!/usr/bin/python3
"""torch_moe_reference.py - the driver that runs the independent PyTorch implementation of libmoe's MoE layer
(moe/moe.h) for tests/test_torch_reference.c. The layer's math (router, top-k, gates, capacity, aux and z
losses, SwiGLU experts, combine) lives in tests/torch_moe.py (SparseMoeBlock, written the way a Hugging Face
Mixtral / DeepSeek block would be); this file only reads a case, runs it and writes the result.

It reads one case (config, weights, input x, upstream gradient dout), computes in float32
    out = MoE(x),  aux = E * sum_e f_e P_e,  z = mean_t logsumexp(logits_t)^2,
    loss = sum(out * dout) + aux_coef * aux + z_coef * z
and with autograd the gradients of loss wrt x, router_w, w1, w3, w2, and writes them with the routing
(chosen expert ids and the capacity mask) to a result file.

Run (Debian's python, which has python3-torch; exit 77 when torch cannot be imported):
    /usr/bin/python3 tests/torch_moe_reference.py CASE_FILE RESULT_FILE

Binary formats (little-endian; i32 = int32, f32 = float32; arrays row-major, C order):
  case file:   b"MOEC", i32 version=1,
               i32 T, d, d_ff, E, k, score_func (0 softmax, 1 sigmoid), renormalize (0/1),
                   drop_priority (0 token order, 1 score),
               f32 capacity_factor, aux_coef, z_coef,
               f32 x[T,d], router_w[E,d], w1[E,d_ff,d], w3[E,d_ff,d], w2[E,d,d_ff], expert_bias[E], dout[T,d]
  result file: b"MOER", i32 version=1, i32 T, d, d_ff, E, k,
               i32 expert[T,k] (best first), i32 kept[T,k] (0/1),
               f32 aux, z, out[T,d], dx[T,d], d_router_w[E,d], dw1[E,d_ff,d], dw3[E,d_ff,d], dw2[E,d,d_ff]
Both sides check the magic, the version and that the file size is exactly what the header implies.
"""
import math
import struct
import sys

VERSION = 1
CASE_HEADER = struct.Struct("<4s9i3f")
RESULT_HEADER = struct.Struct("<4s6i")


def fail(msg):
    sys.stderr.write("torch_moe_reference: %s\n" % msg)
    sys.exit(2)


def read_case(path, torch):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < CASE_HEADER.size:
        fail("%s: %d bytes, shorter than the %d-byte header" % (path, len(data), CASE_HEADER.size))
    magic, version, T, d, f_, E, k, func, renorm, prio, cf, aux_coef, z_coef = CASE_HEADER.unpack_from(data)
    if magic != b"MOEC" or version != VERSION:
        fail("%s: bad magic %r or version %d (want b'MOEC', %d)" % (path, magic, version, VERSION))
    if min(T, d, f_, E, k) < 1 or k > E or func not in (0, 1) or renorm not in (0, 1) or prio not in (0, 1):
        fail("%s: invalid header T=%d d=%d d_ff=%d E=%d k=%d func=%d renorm=%d prio=%d"
             % (path, T, d, f_, E, k, func, renorm, prio))
    shapes = [("x", (T, d)), ("router_w", (E, d)), ("w1", (E, f_, d)), ("w3", (E, f_, d)),
              ("w2", (E, d, f_)), ("expert_bias", (E,)), ("dout", (T, d))]
    want = CASE_HEADER.size + 4 * sum(math.prod(s) for _, s in shapes)
    if len(data) != want:
        fail("%s: %d bytes, but the header implies %d" % (path, len(data), want))
    cfg = dict(T=T, d=d, d_ff=f_, E=E, k=k, sigmoid=func == 1, renormalize=renorm == 1,
               score_priority=prio == 1, capacity_factor=cf, aux_coef=aux_coef, z_coef=z_coef)
    tensors, offset = {}, CASE_HEADER.size
    for name, shape in shapes:
        n = math.prod(shape)
        # bytearray: a writable buffer, so frombuffer does not warn; clone detaches it from the bytes
        buf = bytearray(data[offset:offset + 4 * n])
        tensors[name] = torch.frombuffer(buf, dtype=torch.float32).reshape(shape).clone()
        offset += 4 * n
    return cfg, tensors


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: %s CASE_FILE RESULT_FILE\n" % sys.argv[0])
        sys.exit(2)
    try:
        import torch
    except ImportError as err:
        sys.stderr.write("torch_moe_reference: cannot import torch (%s); skipping\n" % err)
        sys.exit(77)
    import torch_moe  # tests/torch_moe.py, next to this script (sys.path[0])

    cfg, t = read_case(sys.argv[1], torch)
    block = torch_moe.SparseMoeBlock(cfg["d"], cfg["d_ff"], cfg["E"], cfg["k"],
                                     score_func="sigmoid" if cfg["sigmoid"] else "softmax",
                                     renormalize=cfg["renormalize"], capacity_factor=cfg["capacity_factor"],
                                     drop_by_score=cfg["score_priority"], row_invariant_router=True)
    block.load_stacked(t["router_w"], t["w1"], t["w3"], t["w2"], t["expert_bias"])
    x = t["x"].requires_grad_()
    out, aux, z, experts, kept = block(x)
    loss = (out * t["dout"]).sum() + cfg["aux_coef"] * aux + cfg["z_coef"] * z
    loss.backward()

    header = RESULT_HEADER.pack(b"MOER", VERSION, cfg["T"], cfg["d"], cfg["d_ff"], cfg["E"], cfg["k"])
    ints = torch.cat([experts.reshape(-1), kept.reshape(-1).to(torch.int64)]).to(torch.int32)
    floats = torch.cat([torch.stack([aux.detach(), z.detach()]), out.detach().reshape(-1)] +
                       [g.reshape(-1) for g in (x.grad,) + block.stacked_grads()])
    with open(sys.argv[2], "wb") as f:
        f.write(header)
        f.write(ints.numpy().astype("<i4").tobytes())
        f.write(floats.to(torch.float32).numpy().astype("<f4").tobytes())


if __name__ == "__main__":
    main()
