/* backend.h — the device-dependent steps of one MoE layer, as a table of functions per backend (CPU,
 * CUDA), so that moe/layer.c is written once: it owns the order of the steps, the exchanges, the global
 * capacity rule and the error messages; a backend owns where the buffers live and how each step computes.
 *
 * Memory: per-token arrays of the routing (logits ... perm_token) and every row buffer live in the
 * backend's memory (host for the CPU, device for CUDA); per-expert counts, offsets and plans are host
 * arrays on every backend. Token rows (x, out, dx, dout) are moe_real (float on CUDA); rows on the expert
 * side (xp, y, dy, dxp and the exchanges' payloads) are `row_elem` bytes per value: moe_real on the CPU,
 * bf16 on CUDA (DESIGN.md, Precision). The caller's tensors (x, out, dout, dx, weights, gradients) are in
 * the backend's memory too: device pointers for a layer on a GPU layout. */
#ifndef MOE_BACKEND_H
#define MOE_BACKEND_H

#include "moe/moe.h"
#include "router/routing.h"

typedef struct moe_backend moe_backend; /* one layer's backend state (buffers, handles) */

typedef struct moe_backend_ops {
    const char *name;
    size_t row_elem; /* bytes per value of the expert-side rows */

    moe_status (*create)(const moe_config *cfg, const moe_parallel *par, moe_backend **out);
    void (*destroy)(moe_backend *b);

    /* memory of the backend; upload/download are synchronous, and either may name the same buffer twice */
    moe_status (*alloc)(moe_backend *b, size_t nbytes, void **out);
    void (*free)(moe_backend *b, void *ptr);
    moe_status (*upload)(moe_backend *b, void *dst, const void *host_src, size_t nbytes);
    moe_status (*download)(moe_backend *b, void *host_dst, const void *src, size_t nbytes);
    moe_status (*copy)(moe_backend *b, void *dst, const void *src, size_t nbytes); /* within the backend */
    /* the per-token arrays of a routing for up to max_tokens tokens in this memory, counts on the host */
    moe_status (*routing_alloc)(moe_backend *b, moe_routing *r, int max_tokens, int num_experts, int top_k,
                                int num_ranks);
    void (*routing_free)(moe_backend *b, moe_routing *r);

    /* logits -> scores (+ bias for selection, sigmoid only; bias is a host [E] array) -> top-k (skipped
     * when use_given_experts: r->expert holds them already) -> gates. r->num_tokens is set. */
    moe_status (*route)(moe_backend *b, const moe_layer_weights *w, const moe_real *x, const moe_real *bias,
                        int use_given_experts, moe_routing *r);
    /* slot, perm_token on the backend; num_tokens_per_expert, expert_offset, num_tokens_per_rank,
     * num_kept, num_dropped on the host (router/layout.h) — from r->expert and r->kept. */
    moe_status (*dispatch_layout)(moe_backend *b, moe_routing *r);
    /* xp[r] = x[perm_token[r]] (converted to the row type) */
    moe_status (*permute)(moe_backend *b, const moe_real *x, const int *perm_token, int num_rows, int d, void *xp);
    /* out[t] = sum_j gate * y[slot] in a fixed j order (gate NULL = 1) */
    moe_status (*combine)(moe_backend *b, const void *y, const int *slot, const moe_real *gate, int num_tokens,
                          int top_k, int d, moe_real *out);
    moe_status (*combine_backward)(moe_backend *b, const moe_real *dout, const void *y, const int *slot,
                                   const moe_real *gate, int num_tokens, int top_k, int d, void *dy, moe_real *dgate);

    /* SwiGLU experts on `rows` rows in expert-major order (expert_offset: host [E_local + 1]); the backend
     * keeps what backward needs. Backward: segment_start as moe_expert_ffn_backward_cpu (host). */
    moe_status (*experts_forward)(moe_backend *b, const moe_layer_weights *w, const int *expert_offset, int rows,
                                  const void *xp, void *y);
    moe_status (*experts_backward)(moe_backend *b, const moe_layer_weights *w, moe_layer_weights *grads,
                                   const int *segment_start, int segments, int rows, const void *xp,
                                   const void *dy, void *dxp);

    /* This rank's shares {load balance, z} of the router losses (aux_loss.h); r->num_selected_per_expert
     * holds the global counts. */
    moe_status (*router_losses)(moe_backend *b, const moe_routing *r, int num_tokens_global, double loss[2]);
    /* From dL/dgate: dL/dscores (gates, balance loss), dL/dlogits (scores, z-loss), then
     * grads->router_w += dlogits^T x and, when dx != NULL, dx += dlogits router_w. */
    moe_status (*router_backward)(moe_backend *b, const moe_layer_weights *w, const moe_routing *r,
                                  const moe_real *x, const moe_real *dgate, int num_tokens_global,
                                  moe_layer_weights *grads, moe_real *dx);
} moe_backend_ops;

/* The CPU backend (always built; float or double with moe_real). */
extern const moe_backend_ops moe_backend_cpu;
/* The CUDA backend (libmoe_cuda; float only): parallel_gpu.h layouts set it. */
extern const moe_backend_ops moe_backend_cuda;

#endif
