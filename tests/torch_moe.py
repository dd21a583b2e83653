"""torch_moe.py - libmoe's MoE layer (moe/moe.h) written once in PyTorch, the way Hugging Face's Mixtral and
DeepSeek-V3 code writes it. It is an independent implementation: it shares nothing with the C/CUDA code but
the formulas below. The math lives here only; three thin drivers import it:

  tests/torch_moe_reference.py        the reference of tests/test_torch_reference.c (float32, autograd)
  bench/bench_moe_layer_torch.py      CPU timing of SparseMoeBlock (reference point for bench_moe_layer.c)
  bench/bench_moe_layer_torch_gpu.py  GPU timing of grouped_mm_moe (bf16 experts) and transformers' block

The layer, for tokens x [T, d], E SwiGLU experts of width d_ff, k experts per token:
  router    logits = x Wr^T                                                   [T, E]
            s = softmax(logits) over experts (Mixtral), or s = sigmoid(logits) (DeepSeek-V3)
  top-k     e_t1..e_tk = the k largest of s[t] (+ b, the selection bias, sigmoid only), best first;
            equal values go to the lower expert id
  gates     g[t, j] = s[t, e_tj], or s[t, e_tj] / sum_j' s[t, e_tj'] when renormalised
  capacity  C = ceil(cf T k / E) slots per expert (cf = 0: dropless); an expert keeps its first C
            assignments in token order, or its C highest-scoring ones (equal scores: lower token first)
  experts   FFN_e(x) = (silu(x W1_e^T) * (x W3_e^T)) W2_e^T                  (SwiGLU)
  combine   out[t] = sum_{j kept} g[t, j] FFN_{e_tj}(x[t])
  losses    aux = E sum_e f_e P_e, f_e = (assignments to e, before capacity) / (T k),
                  P_e = mean_t p[t, e] with p = s (softmax) or s / sum_e s (sigmoid)
            z = mean_t logsumexp(logits[t])^2
SparseMoeBlock runs on the device and in the dtype of its parameters and input: float32 on the CPU for the
test and the CPU benchmark; every tensor it makes follows x's device, so CUDA takes no other code. Under
torch.autocast (the CPU benchmark's --autocast-bf16) its GEMMs run in bf16, the router's included; the logits
are taken back to float32, as Hugging Face's Mixtral does with softmax(dtype=torch.float), so the scores,
top-k, gates, losses and the combine (a bf16 expert output times a float32 gate) stay float32.
grouped_mm_moe is the GPU benchmark's dropless variant: a float32 router and bf16 experts through
torch._grouped_mm (recent CUDA builds of torch only).
"""
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

SCORE_FUNCS = ("softmax", "sigmoid")

# ---- router ------------------------------------------------------------------------------------------


def router_scores(logits, score_func="softmax"):
    """s = softmax(logits) over the experts (Mixtral), or s = sigmoid(logits) elementwise (DeepSeek-V3)."""
    if score_func == "softmax":
        return F.softmax(logits, dim=-1)
    if score_func == "sigmoid":
        return torch.sigmoid(logits)
    raise ValueError(f"score_func must be one of {SCORE_FUNCS}, got {score_func!r}")


def select_experts(scores, top_k, bias=None):
    """experts[t] = the top_k expert ids of scores[t] + bias, best first   -> int64 [T, top_k].

    The bias (DeepSeek-V3's e_score_correction_bias) steers the selection only: the gates are read from
    the scores without it, and no gradient flows through the choice. A stable descending sort instead of
    torch.topk pins the order of equal values to the lower expert id (topk leaves it unspecified)."""
    choice = scores.detach() if bias is None else scores.detach() + bias
    return torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]


def gate_weights(scores, experts, renormalize):
    """g[t, j] = s[t, e_tj]; renormalised (Mixtral's norm_topk_prob): g[t, j] / sum_j' g[t, j']   -> [T, k]."""
    gates = scores.gather(1, experts)
    if renormalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates


def expert_capacity(capacity_factor, num_tokens, top_k, num_experts):
    """C = ceil(cf T k / E) slots per expert; 0 (dropless) when cf <= 0.

    cf T k / E is taken with a 1e-6 relative slack, so that a product that lands just above an integer by
    rounding (1.1 * 10 = 11.000000000000002) still gives 11, as router/capacity.h specifies."""
    if capacity_factor <= 0:
        return 0
    slots = capacity_factor * num_tokens * top_k / num_experts
    return int(math.ceil(slots - 1e-6 * max(slots, 1.0)))


def capacity_mask(scores, experts, capacity, by_score=False):
    """kept[t, j] = whether assignment (t, j) is among the first C of expert e_tj   -> bool [T, k].

    Token order (GShard / Switch): an assignment's place in its expert's queue is the running count of
    the one-hot expert ids over assignments in (token, choice) order. Score order: each expert ranks the
    tokens that chose it by s[t, e] descending (stable: equal scores keep the lower token first).
    capacity == 0 keeps everything."""
    T, k = experts.shape
    E = scores.shape[1]
    if capacity == 0:
        return torch.ones(T, k, dtype=torch.bool, device=experts.device)
    if not by_score:
        onehot = F.one_hot(experts.reshape(-1), E)                          # [T*k, E]
        position = (torch.cumsum(onehot, dim=0) * onehot).sum(-1) - 1        # [T*k]
        return (position < capacity).reshape(T, k)
    chosen = F.one_hot(experts, E).sum(1).bool()                             # [T, E]
    masked = torch.where(chosen, scores.detach(), torch.full_like(scores, -math.inf))
    order = torch.sort(masked, dim=0, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(0, order, torch.arange(T, device=order.device).unsqueeze(1).expand(T, E).contiguous())
    keep = chosen & (rank < capacity)                                        # [T, E]
    return keep.gather(1, experts)


def expert_counts(experts, num_experts):
    """n_e = number of (token, choice) assignments to expert e, before capacity   -> int64 [E]."""
    return torch.bincount(experts.reshape(-1), minlength=num_experts)


def load_balancing_loss(scores, experts, num_experts, score_func="softmax"):
    """aux = E sum_e f_e P_e (Switch Transformer), f_e = n_e / (T k), P_e = mean_t p[t, e]   -> scalar.

    p = s for softmax; for sigmoid the scores are first normalised per token, p = s / sum_e s, so that P
    is a distribution as it is for softmax. f counts assignments before capacity; only P carries a
    gradient."""
    T, k = experts.shape
    f = expert_counts(experts, num_experts).to(scores.dtype) / (T * k)
    p = scores if score_func == "softmax" else scores / scores.sum(dim=-1, keepdim=True)
    return num_experts * (f * p.mean(dim=0)).sum()


def router_z_loss(logits):
    """z = mean_t (logsumexp_e logits[t, e])^2 (ST-MoE's router z-loss)   -> scalar."""
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


# ---- experts -----------------------------------------------------------------------------------------


def swiglu(gate, up):
    """silu(gate) * up, with silu(a) = a sigmoid(a)."""
    return F.silu(gate) * up


def swiglu_ffn(x, w1, w3, w2):
    """FFN(x) = (silu(x W1^T) * (x W3^T)) W2^T; W1, W3 [d_ff, d], W2 [d, d_ff] (nn.Linear's layout)."""
    return F.linear(swiglu(F.linear(x, w1), F.linear(x, w3)), w2)


class SwiGLUExpert(torch.nn.Module):
    """One expert, as Hugging Face's MixtralBlockSparseTop2MLP: w2(silu(w1 x) * w3 x), no biases."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = torch.nn.Linear(d_model, d_ff, bias=False)
        self.w3 = torch.nn.Linear(d_model, d_ff, bias=False)
        self.w2 = torch.nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        """FFN(x) = (silu(x W1^T) * (x W3^T)) W2^T."""
        return swiglu_ffn(x, self.w1.weight, self.w3.weight, self.w2.weight)


# ---- the layer ---------------------------------------------------------------------------------------


class MoeOutput(NamedTuple):
    out: torch.Tensor       # [T, d]
    aux_loss: torch.Tensor  # scalar, E sum_e f_e P_e
    z_loss: torch.Tensor    # scalar, mean_t logsumexp(logits[t])^2
    experts: torch.Tensor   # int64 [T, k], best first
    kept: torch.Tensor      # bool [T, k], the capacity mask


class SparseMoeBlock(torch.nn.Module):
    """Router + E SwiGLU experts, a loop over experts as in Hugging Face's MixtralSparseMoeBlock:
    out[t] = sum_{j kept} g[t, j] FFN_{e_tj}(x[t]), plus the aux and z losses (module docstring).

    Parameters: router.weight [E, d]; experts[e].w1/.w3.weight [d_ff, d], experts[e].w2.weight [d, d_ff];
    buffer expert_bias [E] (the selection bias, used with score_func='sigmoid')."""

    def __init__(self, d_model, d_ff, num_experts, top_k, score_func="softmax", renormalize=True,
                 capacity_factor=0.0, drop_by_score=False, row_invariant_router=False):
        super().__init__()
        # row_invariant_router: the router's logits one token row at a time, so that equal rows get equal bits
        # wherever they sit, as libmoe's fixed row blocks guarantee (kernels/gemm_rows.h); a whole-matrix sgemm
        # need not (Debian's torch runs OpenBLAS, whose Haswell and Zen kernels give a row other bits by its
        # position), which breaks exact ties in another order than libmoe's. For the exact-tie test cases.
        self.row_invariant_router = row_invariant_router
        if score_func not in SCORE_FUNCS:
            raise ValueError(f"score_func must be one of {SCORE_FUNCS}, got {score_func!r}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts = {num_experts}], got {top_k}")
        self.num_experts, self.top_k = num_experts, top_k
        self.score_func, self.renormalize = score_func, renormalize
        self.capacity_factor, self.drop_by_score = capacity_factor, drop_by_score
        self.router = torch.nn.Linear(d_model, num_experts, bias=False)
        self.experts = torch.nn.ModuleList(SwiGLUExpert(d_model, d_ff) for _ in range(num_experts))
        self.register_buffer("expert_bias", torch.zeros(num_experts))

    @torch.no_grad()
    def load_stacked(self, router_w, w1, w3, w2, expert_bias=None):
        """Copies libmoe's stacked weights in: router_w [E, d], w1 and w3 [E, d_ff, d], w2 [E, d, d_ff]."""
        self.router.weight.copy_(router_w)
        for e, expert in enumerate(self.experts):
            expert.w1.weight.copy_(w1[e])
            expert.w3.weight.copy_(w3[e])
            expert.w2.weight.copy_(w2[e])
        if expert_bias is not None:
            self.expert_bias.copy_(expert_bias)

    def stacked_grads(self):
        """The parameters' gradients in the stacked layout of load_stacked: (router_w, w1, w3, w2).
        An expert that received no rows has no .grad; its gradient is zero."""
        def grad(p):
            return p.grad if p.grad is not None else torch.zeros_like(p)

        def stack(name):
            return torch.stack([grad(getattr(expert, name).weight) for expert in self.experts])
        return grad(self.router.weight), stack("w1"), stack("w3"), stack("w2")

    def forward(self, x):
        """x [T, d] -> MoeOutput(out, aux_loss, z_loss, experts, kept); see the module docstring."""
        T, E, k = x.shape[0], self.num_experts, self.top_k
        if self.row_invariant_router:
            logits = torch.cat([self.router(x[t:t + 1]) for t in range(T)])  # [T, E], one row per call
        else:
            logits = self.router(x)                                          # [T, E]
        # bf16 under autocast: route from float32 logits (a no-op for float32 and float64)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        scores = router_scores(logits, self.score_func)
        experts = select_experts(scores, k, self.expert_bias if self.score_func == "sigmoid" else None)
        gates = gate_weights(scores, experts, self.renormalize)              # [T, k]
        C = expert_capacity(self.capacity_factor, T, k, E)
        kept = capacity_mask(scores, experts, C, self.drop_by_score)         # [T, k]

        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            # (token, choice) pairs routed to e and kept, in token order
            token, choice = torch.where((experts == e) & kept)
            if token.numel() == 0:
                continue
            y = expert(x.index_select(0, token)) * gates[token, choice].unsqueeze(-1)
            out.index_add_(0, token, y)

        aux = load_balancing_loss(scores, experts, E, self.score_func)
        z = router_z_loss(logits)
        return MoeOutput(out, aux, z, experts, kept)


# ---- the GPU benchmark's variant: bf16 experts as grouped GEMMs ---------------------------------------


def grouped_swiglu_ffn(rows, w13, w2, offs):
    """FFN over rows sorted by expert, as two grouped GEMMs (torch._grouped_mm):
    h = rows_e W13_e, a = silu(h[:, :d_ff]) * h[:, d_ff:], y = a W2_e for each expert's row group.

    rows [N, d]; w13 [E, d, 2 d_ff] (W1^T and W3^T side by side); w2 [E, d_ff, d]; offs int32 [E], the
    end row of each expert's group (cumulative counts)."""
    d_ff = w2.shape[1]
    h = torch._grouped_mm(rows, w13, offs=offs)
    return torch._grouped_mm(swiglu(h[:, :d_ff], h[:, d_ff:]), w2, offs=offs)


def grouped_mm_moe(x, router_w, w13, w2, top_k):
    """Dropless MoE with a float32 softmax router (top-k renormalised) and bf16 grouped-GEMM experts:
    out[t] = sum_j g[t, j] FFN_{e_tj}(x[t]) in float32, no losses (the GPU benchmark's layer).

    The assignments are sorted by expert (stable: token order within an expert), the bf16 rows gathered,
    the experts run by grouped_swiglu_ffn, and the gated rows added back with index_add.
    x [T, d]; router_w [E, d] float32; w13 [E, d, 2 d_ff] and w2 [E, d_ff, d] bf16."""
    T, d = x.shape
    E = w13.shape[0]
    scores = router_scores(F.linear(x.float(), router_w), "softmax")
    experts = select_experts(scores, top_k)
    gates = gate_weights(scores, experts, renormalize=True)
    order = experts.flatten().argsort(stable=True)                          # assignments by expert
    token = order // top_k
    offs = expert_counts(experts, E).cumsum(0).to(torch.int32)
    y = grouped_swiglu_ffn(x.to(torch.bfloat16)[token], w13, w2, offs)
    out = torch.zeros(T, d, device=x.device, dtype=torch.float32)
    return out.index_add(0, token, y.float() * gates.flatten()[order, None])
