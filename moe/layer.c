/* layer.c — one MoE layer on the CPU: route -> permute -> SwiGLU experts -> combine, and its backward.
 * Orchestration only: every op lives in router/, kernels/ or experts/. */
#include <stdlib.h>
#include <string.h>

#include "experts/expert_ffn.h"
#include "kernels/permute.h"
#include "moe/layer_internal.h"
#include "moe/real.h"
#include "router/aux_loss.h"
#include "router/capacity.h"
#include "router/gates.h"
#include "router/layout.h"
#include "router/scores.h"
#include "router/topk.h"

/* Activation and scratch buffers, sized for max_tokens tokens; A = T*k assignment rows. */
typedef struct {
    moe_real *x;             /* [T, d]    copy of the input (router weight gradient)      */
    moe_real *xp;            /* [A, d]    input rows in expert order                      */
    moe_real *h1, *h3, *act; /* [A, d_ff] expert pre-activations and silu(h1) * h3       */
    moe_real *y;             /* [A, d]    expert outputs in expert order                  */
    moe_real *dy, *dxp;      /* [A, d]    backward                                        */
    moe_real *dh1, *dh3;     /* [A, d_ff] backward                                        */
    moe_real *dgate;         /* [A]                                                       */
    moe_real *dscores;       /* [T, E]                                                    */
    moe_real *dlogits;       /* [T, E]                                                    */
} layer_buffers;

struct moe_layer {
    moe_config cfg;
    int max_tokens;
    int has_forward;
    double aux_loss, z_loss;
    moe_real *expert_bias; /* [E] sigmoid routing's selection bias */
    moe_routing routing;
    layer_buffers buf;
};

static void free_buffers(moe_layer *L) {
    moe_real **all = (moe_real **)&L->buf;
    for (size_t i = 0; i < sizeof L->buf / sizeof(moe_real *); i++) free(all[i]);
    memset(&L->buf, 0, sizeof L->buf);
    moe_routing_free(&L->routing);
    L->max_tokens = 0;
}

static moe_status reserve_tokens(moe_layer *L, int num_tokens) {
    if (num_tokens <= L->max_tokens) return MOE_OK;
    free_buffers(L);
    const moe_config *c = &L->cfg;
    size_t T = num_tokens, A = T * c->top_k, d = c->d_model, f = c->d_ff, E = c->num_experts;
    layer_buffers *b = &L->buf;
    b->x = malloc(T * d * sizeof(moe_real));
    b->xp = malloc(A * d * sizeof(moe_real));
    b->h1 = malloc(A * f * sizeof(moe_real));
    b->h3 = malloc(A * f * sizeof(moe_real));
    b->act = malloc(A * f * sizeof(moe_real));
    b->y = malloc(A * d * sizeof(moe_real));
    b->dy = malloc(A * d * sizeof(moe_real));
    b->dxp = malloc(A * d * sizeof(moe_real));
    b->dh1 = malloc(A * f * sizeof(moe_real));
    b->dh3 = malloc(A * f * sizeof(moe_real));
    b->dgate = malloc(A * sizeof(moe_real));
    b->dscores = malloc(T * E * sizeof(moe_real));
    b->dlogits = malloc(T * E * sizeof(moe_real));
    moe_real **all = (moe_real **)b;
    for (size_t i = 0; i < sizeof *b / sizeof(moe_real *); i++)
        if (!all[i]) return free_buffers(L), MOE_ERR_OUT_OF_MEMORY;
    moe_status st = moe_routing_alloc(&L->routing, num_tokens, c->num_experts, c->top_k, c->num_ranks);
    if (st != MOE_OK) return free_buffers(L), st;
    L->max_tokens = num_tokens;
    return MOE_OK;
}

moe_status moe_layer_create(const moe_config *cfg, moe_layer **out_layer) {
    if (!out_layer) return MOE_ERR_INVALID_ARG;
    *out_layer = NULL;
    moe_status st = moe_config_validate(cfg);
    if (st != MOE_OK) return st;
    moe_layer *L = calloc(1, sizeof *L);
    if (!L) return MOE_ERR_OUT_OF_MEMORY;
    L->cfg = *cfg;
    L->expert_bias = calloc(cfg->num_experts, sizeof(moe_real));
    if (!L->expert_bias) return free(L), MOE_ERR_OUT_OF_MEMORY;
    *out_layer = L;
    return MOE_OK;
}

void moe_layer_destroy(moe_layer *L) {
    if (!L) return;
    free_buffers(L);
    free(L->expert_bias);
    free(L);
}

/* Router: logits -> scores -> top-k -> gates -> capacity -> layout. */
static moe_status route(moe_layer *L, const moe_layer_weights *w, int T) {
    const moe_config *c = &L->cfg;
    moe_routing *r = &L->routing;
    int E = c->num_experts, k = c->top_k;
    r->num_tokens = T;
    moe_status st = router_logits_cpu(L->buf.x, w->router_w, T, c->d_model, E, r->logits);
    if (st != MOE_OK) return st;
    router_scores_cpu(c->score_func, r->logits, T, E, r->scores);
    const moe_real *select = r->scores;
    if (c->score_func == MOE_SCORE_SIGMOID) {
        for (size_t i = 0; i < (size_t)T * E; i++) r->select_scores[i] = r->scores[i] + L->expert_bias[i % E];
        select = r->select_scores;
    }
    router_topk_cpu(select, T, E, k, r->expert);
    router_gates_cpu(r->scores, r->expert, T, E, k, c->renormalize, r->gate);
    st = router_apply_capacity_cpu(r, c->capacity_factor, c->drop_priority);
    if (st != MOE_OK) return st;
    router_dispatch_layout_cpu(r);
    return MOE_OK;
}

moe_status moe_layer_forward(moe_layer *L, const moe_layer_weights *w, const moe_real *x, int num_tokens,
                             moe_real *out, moe_layer_stats *stats) {
    if (!L || !w || !x || !out || num_tokens < 1) return MOE_ERR_INVALID_ARG;
    L->has_forward = 0;
    moe_status st = reserve_tokens(L, num_tokens);
    if (st != MOE_OK) return st;
    const moe_config *c = &L->cfg;
    const int T = num_tokens, d = c->d_model, E = c->num_experts, k = c->top_k;
    layer_buffers *b = &L->buf;
    moe_routing *r = &L->routing;
    memcpy(b->x, x, (size_t)T * d * sizeof(moe_real));
    if ((st = route(L, w, T)) != MOE_OK) return st;

    permute_rows_cpu(b->x, r->perm_token, r->num_kept, d, b->xp);
    expert_ffn_forward_cpu(w, E, d, c->d_ff, r->expert_offset, b->xp, b->h1, b->h3, b->act, b->y);
    combine_rows_cpu(b->y, r->slot, r->gate, T, k, d, out);

    L->aux_loss = router_load_balance_loss_cpu(c->score_func, r->scores, r->num_selected_per_expert, T, E, k);
    L->z_loss = router_z_loss_cpu(r->logits, T, E);
    L->has_forward = 1;
    if (stats) {
        stats->aux_loss = L->aux_loss;
        stats->z_loss = L->z_loss;
        stats->weighted_loss = c->aux_loss_coef * L->aux_loss + c->z_loss_coef * L->z_loss;
        stats->num_assignments = T * k;
        stats->num_dropped = r->num_dropped;
        stats->capacity = r->capacity;
        stats->num_tokens_per_expert = r->num_tokens_per_expert;
        stats->num_selected_per_expert = r->num_selected_per_expert;
    }
    return MOE_OK;
}

moe_status moe_layer_backward(moe_layer *L, const moe_layer_weights *w, const moe_real *dout, moe_real *dx,
                              moe_layer_weights *grads) {
    if (!L || !w || !dout || !grads) return MOE_ERR_INVALID_ARG;
    if (!L->has_forward) return MOE_ERR_NO_FORWARD;
    const moe_config *c = &L->cfg;
    const moe_routing *r = &L->routing;
    const int T = r->num_tokens, d = c->d_model, E = c->num_experts, k = c->top_k;
    layer_buffers *b = &L->buf;

    /* Experts: dL/dy per row and dL/dgate, then back through the grouped FFN. */
    combine_rows_backward_cpu(dout, b->y, r->slot, r->gate, T, k, d, b->dy, b->dgate);
    expert_ffn_backward_cpu(w, grads, E, d, c->d_ff, r->expert_offset, b->xp, b->h1, b->h3, b->act, b->dy,
                            b->dh1, b->dh3, b->dxp);

    /* Router: gates and the balance loss give dL/dscores; scores and the z-loss give dL/dlogits. */
    memset(b->dscores, 0, (size_t)T * E * sizeof(moe_real));
    router_gates_backward_cpu(r->scores, r->expert, r->gate, b->dgate, T, E, k, c->renormalize, b->dscores);
    router_load_balance_loss_backward_cpu(c->score_func, r->scores, r->num_selected_per_expert, T, E, k,
                                          c->aux_loss_coef, b->dscores);
    router_scores_backward_cpu(c->score_func, r->scores, b->dscores, T, E, b->dlogits);
    router_z_loss_backward_cpu(r->logits, T, E, c->z_loss_coef, b->dlogits);
    /* dWr += dlogits^T x */
    moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, E, d, T, 1, b->dlogits, E, b->x, d, 1, grads->router_w, d);

    if (dx) {
        /* dx = (unpermute of dxp with unit gates) + dlogits Wr */
        combine_rows_cpu(b->dxp, r->slot, NULL, T, k, d, dx);
        moe__gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, d, E, 1, b->dlogits, E, w->router_w, d, 1, dx, d);
    }
    return MOE_OK;
}

moe_real *moe_layer_expert_bias(moe_layer *L) { return L ? L->expert_bias : NULL; }

moe_status moe_layer_update_expert_bias(moe_layer *L) {
    if (!L) return MOE_ERR_INVALID_ARG;
    if (L->cfg.score_func != MOE_SCORE_SIGMOID) return MOE_ERR_INVALID_CONFIG;
    if (!L->has_forward) return MOE_ERR_NO_FORWARD;
    const moe_routing *r = &L->routing;
    double mean = (double)r->num_tokens * r->top_k / r->num_experts;
    for (int e = 0; e < r->num_experts; e++) {
        double n = r->num_selected_per_expert[e];
        L->expert_bias[e] += L->cfg.bias_update_rate * (moe_real)((n < mean) - (n > mean));
    }
    return MOE_OK;
}

const moe_routing *moe__layer_routing(const moe_layer *L) { return L && L->has_forward ? &L->routing : NULL; }
