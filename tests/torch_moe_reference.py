#!/usr/bin/python3
"""torch_moe_reference.py - an independent PyTorch implementation of libmoe's MoE layer (moe/moe.h),
written the way a Hugging Face Mixtral / DeepSeek block would be, used by tests/test_torch_reference.c.

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


def capacity(cf, T, k, E):
    """Slots per expert; 0 means dropless. The same 1e-6 relative slack as router/capacity.h."""
    if cf <= 0:
        return 0
    slots = cf * T * k / E
    return int(math.ceil(slots - 1e-6 * max(slots, 1.0)))


def capacity_mask(torch, F, scores, experts, C, score_priority):
    """kept[t, j]: whether token t's j-th choice fits in expert experts[t, j]'s first C slots."""
    T, k = experts.shape
    E = scores.shape[1]
    if C == 0:
        return torch.ones(T, k, dtype=torch.bool)
    if not score_priority:
        # Token order: an assignment's position in its expert's queue is the running count of the
        # one-hot over assignments in (token, choice) order (GShard / Switch style).
        onehot = F.one_hot(experts.reshape(-1), E)                      # [T*k, E]
        position = (torch.cumsum(onehot, dim=0) * onehot).sum(-1) - 1    # [T*k]
        return (position < C).reshape(T, k)
    # Score order: per expert, rank its tokens by score (descending, stable => ties to lower token).
    chosen = F.one_hot(experts, E).sum(1).bool()                         # [T, E]
    masked = torch.where(chosen, scores, torch.full_like(scores, -math.inf))
    order = torch.sort(masked, dim=0, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(0, order, torch.arange(T).unsqueeze(1).expand(T, E).contiguous())
    keep = chosen & (rank < C)                                           # [T, E]
    return keep.gather(1, experts)


class SparseMoeBlock:
    """Router + SwiGLU experts; parameters are leaf tensors so autograd gives their gradients."""

    def __init__(self, torch, F, cfg, tensors):
        self.torch, self.F, self.cfg = torch, F, cfg
        self.router_w = tensors["router_w"].requires_grad_()
        self.w1 = tensors["w1"].requires_grad_()
        self.w3 = tensors["w3"].requires_grad_()
        self.w2 = tensors["w2"].requires_grad_()
        self.expert_bias = tensors["expert_bias"]

    def expert(self, e, h):
        F = self.F
        return F.linear(F.silu(F.linear(h, self.w1[e])) * F.linear(h, self.w3[e]), self.w2[e])

    def forward(self, x):
        torch, F, c = self.torch, self.F, self.cfg
        T, E, k = x.shape[0], c["E"], c["k"]
        logits = F.linear(x, self.router_w)                              # [T, E]
        if c["sigmoid"]:
            scores = torch.sigmoid(logits)
            select = scores.detach() + self.expert_bias                  # bias steers selection only
        else:
            scores = F.softmax(logits, dim=-1)
            select = scores.detach()
        experts = torch.sort(select, dim=-1, descending=True, stable=True).indices[:, :k]
        gates = scores.gather(1, experts)                                # [T, k]
        if c["renormalize"]:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        C = capacity(c["capacity_factor"], T, k, E)
        kept = capacity_mask(torch, F, scores.detach(), experts, C, c["score_priority"])

        out = torch.zeros_like(x)
        for e in range(E):
            tok, choice = torch.where((experts == e) & kept)
            if tok.numel() == 0:
                continue
            y = self.expert(e, x[tok]) * gates[tok, choice].unsqueeze(-1)
            out = out.index_add(0, tok, y)

        counts = F.one_hot(experts, E).sum(dim=(0, 1)).to(torch.float32)  # before capacity
        f = counts / (T * k)
        q = scores if not c["sigmoid"] else scores / scores.sum(dim=-1, keepdim=True)
        aux = E * (f * q.mean(dim=0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        return out, aux, z, experts, kept


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: %s CASE_FILE RESULT_FILE\n" % sys.argv[0])
        sys.exit(2)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as err:
        sys.stderr.write("torch_moe_reference: cannot import torch (%s); skipping\n" % err)
        sys.exit(77)

    cfg, t = read_case(sys.argv[1], torch)
    block = SparseMoeBlock(torch, F, cfg, t)
    x = t["x"].requires_grad_()
    out, aux, z, experts, kept = block.forward(x)
    loss = (out * t["dout"]).sum() + cfg["aux_coef"] * aux + cfg["z_coef"] * z
    loss.backward()

    header = RESULT_HEADER.pack(b"MOER", VERSION, cfg["T"], cfg["d"], cfg["d_ff"], cfg["E"], cfg["k"])
    ints = torch.cat([experts.reshape(-1), kept.reshape(-1).to(torch.int64)]).to(torch.int32)
    floats = torch.cat([torch.stack([aux.detach(), z.detach()]), out.detach().reshape(-1)] +
                       [p.grad.reshape(-1) for p in (x, block.router_w, block.w1, block.w3, block.w2)])
    with open(sys.argv[2], "wb") as f:
        f.write(header)
        f.write(ints.numpy().astype("<i4").tobytes())
        f.write(floats.to(torch.float32).numpy().astype("<f4").tobytes())


if __name__ == "__main__":
    main()
