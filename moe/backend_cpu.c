/* backend_cpu.c — the CPU backend of the layer (moe/backend.h): host memory, OpenBLAS through the row-wise
 * GEMMs of kernels/gemm_rows.h, the _cpu ops of router/, kernels/ and experts/. */
#include <stdlib.h>
#include <string.h>

#include "experts/expert_ffn.h"
#include "kernels/gemm_rows.h"
#include "kernels/permute.h"
#include "moe/backend.h"
#include "core/real.h"
#include "router/aux_loss.h"
#include "router/gates.h"
#include "router/layout.h"
#include "router/scores.h"
#include "router/topk.h"

struct moe_backend {
    moe_config cfg;
    int num_local_experts;
    moe_gemm_rows_plan gemm;     /* how row-wise GEMMs are cut into calls (cfg.layout_invariant) */
    moe_real *wgrad_scratch; /* [d_ff * d] one expert weight gradient product */
    int max_rows;            /* what the expert activations hold */
    moe_real *h1, *h3, *act; /* [rows, d_ff] kept from forward for backward */
    moe_real *dh1, *dh3;     /* [rows, d_ff] backward scratch */
    int max_tokens;
    moe_real *dscores, *dlogits; /* [T, E] router backward scratch */
};

static void cpu_destroy(moe_backend *b) {
    if (!b) return;
    moe_gemm_rows_plan_free(&b->gemm);
    free(b->wgrad_scratch);
    free(b->h1), free(b->h3), free(b->act), free(b->dh1), free(b->dh3);
    free(b->dscores), free(b->dlogits);
    free(b);
}

static moe_status cpu_create(const moe_config *cfg, const moe_parallel *par, moe_backend **out) {
    (void)par;
    moe_backend *b = calloc(1, sizeof *b);
    if (!b) return MOE_ERR_OUT_OF_MEMORY;
    b->cfg = *cfg;
    b->num_local_experts = cfg->num_experts / cfg->ep_size;
    int widest = cfg->d_model > cfg->d_ff ? cfg->d_model : cfg->d_ff;
    widest = widest > cfg->num_experts ? widest : cfg->num_experts;
    b->wgrad_scratch = malloc((size_t)cfg->d_ff * cfg->d_model * sizeof(moe_real));
    moe_status st = b->wgrad_scratch ? moe_gemm_rows_plan_init(&b->gemm, cfg->layout_invariant, widest)
                                     : MOE_ERR_OUT_OF_MEMORY;
    if (st != MOE_OK) return cpu_destroy(b), st;
    *out = b;
    return MOE_OK;
}

static moe_status cpu_alloc(moe_backend *b, size_t nbytes, void **out) {
    (void)b;
    *out = malloc(nbytes ? nbytes : 1);
    return *out ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
}

static void cpu_free(moe_backend *b, void *ptr) {
    (void)b;
    free(ptr);
}

static moe_status cpu_copy(moe_backend *b, void *dst, const void *src, size_t nbytes) {
    (void)b;
    memmove(dst, src, nbytes);
    return MOE_OK;
}

static moe_status cpu_routing_alloc(moe_backend *b, moe_routing *r, int max_tokens, int num_experts, int top_k,
                                    int num_ranks) {
    (void)b;
    return moe_routing_alloc(r, max_tokens, num_experts, top_k, num_ranks);
}

static void cpu_routing_free(moe_backend *b, moe_routing *r) {
    (void)b;
    moe_routing_free(r);
}

/* Grows a set of moe_real buffers to count reals each (contents are not kept). */
static moe_status grow(moe_real **bufs[], int num, size_t count) {
    moe_status st = MOE_OK;
    for (int i = 0; i < num; i++) {
        free(*bufs[i]);
        *bufs[i] = malloc((count ? count : 1) * sizeof(moe_real));
        if (!*bufs[i]) st = MOE_ERR_OUT_OF_MEMORY;
    }
    return st;
}

static moe_status cpu_route(moe_backend *b, const moe_layer_weights *w, const moe_real *x, const moe_real *bias,
                            int use_given_experts, moe_routing *r) {
    const moe_config *c = &b->cfg;
    const int T = r->num_tokens, E = c->num_experts, k = c->top_k;
    moe_status st = moe_router_logits_cpu(&b->gemm, x, w->router_w, T, c->d_model, E, r->logits);
    if (st != MOE_OK) return st;
    moe_router_scores_cpu(c->score_func, r->logits, T, E, r->scores);
    const moe_real *select = r->scores;
    if (c->score_func == MOE_SCORE_SIGMOID) {
        for (size_t i = 0; i < (size_t)T * E; i++) r->select_scores[i] = r->scores[i] + bias[i % E];
        select = r->select_scores;
    }
    if (!use_given_experts) moe_router_topk_cpu(select, T, E, k, r->expert);
    moe_router_gates_cpu(r->scores, r->expert, T, E, k, c->renormalize, r->expert_score, r->gate);
    return MOE_OK;
}

static moe_status cpu_dispatch_layout(moe_backend *b, moe_routing *r) {
    (void)b;
    moe_router_dispatch_layout_cpu(r);
    return MOE_OK;
}

static moe_status cpu_permute(moe_backend *b, const moe_real *x, const int *perm_token, int num_rows, int d, void *xp) {
    (void)b;
    moe_permute_rows_cpu(x, perm_token, num_rows, d, xp);
    return MOE_OK;
}

static moe_status cpu_combine(moe_backend *b, const void *y, const int *slot, const moe_real *gate, int num_tokens,
                              int top_k, int d, moe_real *out) {
    (void)b;
    moe_combine_rows_cpu(y, slot, gate, num_tokens, top_k, d, out);
    return MOE_OK;
}

static moe_status cpu_combine_backward(moe_backend *b, const moe_real *dout, const void *y, const int *slot,
                                       const moe_real *gate, int num_tokens, int top_k, int d, void *dy,
                                       moe_real *dgate) {
    (void)b;
    moe_combine_rows_backward_cpu(dout, y, slot, gate, num_tokens, top_k, d, dy, dgate);
    return MOE_OK;
}

static moe_status cpu_experts_forward(moe_backend *b, const moe_layer_weights *w, const int *expert_offset, int rows,
                                      const void *xp, void *y) {
    if (rows > b->max_rows) {
        moe_real **bufs[] = {&b->h1, &b->h3, &b->act, &b->dh1, &b->dh3};
        b->max_rows = 0;
        moe_status st = grow(bufs, 5, (size_t)rows * b->cfg.d_ff);
        if (st != MOE_OK) return st;
        b->max_rows = rows;
    }
    moe_expert_ffn_forward_cpu(w, b->num_local_experts, b->cfg.d_model, b->cfg.d_ff, expert_offset, xp, b->h1, b->h3,
                           b->act, y, &b->gemm);
    return MOE_OK;
}

static moe_status cpu_experts_backward(moe_backend *b, const moe_layer_weights *w, moe_layer_weights *grads,
                                       const int *segment_start, int segments, int rows, const void *xp,
                                       const void *dy, void *dxp) {
    if (rows > b->max_rows) return MOE_ERR_NO_FORWARD;
    moe_expert_ffn_backward_cpu(w, grads, b->num_local_experts, b->cfg.d_model, b->cfg.d_ff, segment_start, segments, xp,
                            b->h1, b->h3, b->act, dy, b->dh1, b->dh3, dxp, b->wgrad_scratch, &b->gemm);
    return MOE_OK;
}

static moe_status cpu_router_losses(moe_backend *b, const moe_routing *r, int num_tokens_global, double loss[2]) {
    const moe_config *c = &b->cfg;
    loss[0] = moe_router_load_balance_loss_cpu(c->score_func, r->scores, r->num_selected_per_expert, r->num_tokens,
                                           num_tokens_global, c->num_experts, c->top_k);
    loss[1] = moe_router_z_loss_cpu(r->logits, r->num_tokens, num_tokens_global, c->num_experts);
    return MOE_OK;
}

static moe_status cpu_router_backward(moe_backend *b, const moe_layer_weights *w, const moe_routing *r,
                                      const moe_real *x, const moe_real *dgate, int num_tokens_global,
                                      moe_layer_weights *grads, moe_real *dx) {
    const moe_config *c = &b->cfg;
    const int T = r->num_tokens, Tg = num_tokens_global, d = c->d_model, E = c->num_experts, k = c->top_k;
    if (T > b->max_tokens) {
        moe_real **bufs[] = {&b->dscores, &b->dlogits};
        b->max_tokens = 0;
        moe_status st = grow(bufs, 2, (size_t)T * E);
        if (st != MOE_OK) return st;
        b->max_tokens = T;
    }
    /* gates and the balance loss give dL/dscores; scores and the z-loss give dL/dlogits */
    memset(b->dscores, 0, (size_t)T * E * sizeof(moe_real));
    moe_router_gates_backward_cpu(r->scores, r->expert, r->gate, dgate, T, E, k, c->renormalize, b->dscores);
    moe_router_load_balance_loss_backward_cpu(c->score_func, r->scores, r->num_selected_per_expert, T, Tg, E, k,
                                          c->aux_loss_coef, b->dscores);
    moe_router_scores_backward_cpu(c->score_func, r->scores, b->dscores, T, E, b->dlogits);
    moe_router_z_loss_backward_cpu(r->logits, T, Tg, E, c->z_loss_coef, b->dlogits);
    /* dWr += dlogits^T x (a sum over this rank's tokens; moe_layer_reduce_gradients sums over ranks) */
    moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, E, d, T, 1, b->dlogits, E, x, d, 1, grads->router_w, d);
    if (dx) moe_gemm_rows_cpu(&b->gemm, CblasNoTrans, T, d, E, b->dlogits, w->router_w, 1, dx);
    return MOE_OK;
}

const moe_backend_ops moe_backend_cpu = {
    .name = "cpu",
    .row_elem = sizeof(moe_real),
    .create = cpu_create,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .routing_alloc = cpu_routing_alloc,
    .routing_free = cpu_routing_free,
    .route = cpu_route,
    .dispatch_layout = cpu_dispatch_layout,
    .permute = cpu_permute,
    .combine = cpu_combine,
    .combine_backward = cpu_combine_backward,
    .experts_forward = cpu_experts_forward,
    .experts_backward = cpu_experts_backward,
    .router_losses = cpu_router_losses,
    .router_backward = cpu_router_backward,
};
