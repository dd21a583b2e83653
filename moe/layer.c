/* layer.c — one MoE layer on the CPU, on one rank of any expert-parallel layout:
 *   route (local) -> capacity (global) -> layout -> permute -> dispatch (EP all-to-all)
 *   -> SwiGLU experts (this rank's) -> combine (reverse all-to-all) -> weighted sum over k
 * and its backward along the same routes. Orchestration only: the ops live in router/, kernels/,
 * experts/ and alltoall/. With a world of one the exchanges are copies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/dispatch.h"
#include "experts/expert_ffn.h"
#include "kernels/gemm_rows.h"
#include "kernels/permute.h"
#include "moe/global_routing.h"
#include "moe/layer_internal.h"
#include "moe/real.h"
#include "router/aux_loss.h"
#include "router/gates.h"
#include "router/layout.h"
#include "router/scores.h"
#include "router/topk.h"

/* Buffers for this rank's T tokens, A = T*k assignment rows, in layout (send) order. */
typedef struct {
    moe_real *x;       /* [T, d]  copy of the input (router weight gradient)                */
    moe_real *xp;      /* [A, d]  input rows in send order                                  */
    moe_real *y;       /* [A, d]  expert outputs, back from the combine, in send order      */
    moe_real *dy;      /* [A, d]  dL/dy in send order                                       */
    moe_real *dxp;     /* [A, d]  dL/dxp back from the experts, in send order               */
    moe_real *dgate;   /* [A]                                                               */
    moe_real *dscores; /* [T, E]                                                            */
    moe_real *dlogits; /* [T, E]                                                            */
} token_buffers;

/* Buffers for the N rows this rank's experts received, expert-major. */
typedef struct {
    moe_real *staging;       /* [N, d]    peer-major landing zone of the exchanges         */
    moe_real *x;             /* [N, d]    expert inputs                                   */
    moe_real *h1, *h3, *act; /* [N, d_ff] pre-activations and silu(h1) * h3              */
    moe_real *y;             /* [N, d]    expert outputs                                  */
    moe_real *dy, *dx;       /* [N, d]                                                    */
    moe_real *dh1, *dh3;     /* [N, d_ff]                                                 */
} row_buffers;

struct moe_layer {
    moe_config cfg;
    const moe_parallel *par;
    moe_parallel *owned_par; /* a world of one, when the caller gave none */
    int num_local_experts;
    int max_tokens, max_rows; /* what token_buffers and row_buffers hold */
    int has_forward;
    const int *forced_experts; /* [T*k] routing to use instead of top-k in the next forward, or NULL */
    long completed_steps;  /* forward+backward pairs done, for failure messages */
    int num_tokens_global;
    double aux_loss, z_loss;
    moe_real *expert_bias; /* [E] sigmoid routing's selection bias */
    gemm_rows_plan gemm;   /* how row-wise GEMMs are cut into calls (cfg.layout_invariant) */
    moe_real *wgrad_scratch; /* [d_ff * d] one expert weight gradient product */
    int *expected_recv;    /* [ep * E_local] */
    moe_routing routing;
    moe_global_routing global;
    moe_dispatch_plan plan;
    token_buffers tok;
    row_buffers rows;
};

/* (Re)allocates every pointer of a struct made only of moe_real pointers to count[i] reals. */
static moe_status realloc_all(void *bufs, size_t num_ptrs, const size_t *count) {
    moe_real **p = bufs;
    moe_status st = MOE_OK;
    for (size_t i = 0; i < num_ptrs; i++) {
        free(p[i]);
        p[i] = malloc((count[i] ? count[i] : 1) * sizeof(moe_real));
        if (!p[i]) st = MOE_ERR_OUT_OF_MEMORY;
    }
    return st;
}

static void free_all(void *bufs, size_t num_ptrs) {
    moe_real **p = bufs;
    for (size_t i = 0; i < num_ptrs; i++) free(p[i]), p[i] = NULL;
}

#define NUM_PTRS(s) (sizeof(s) / sizeof(moe_real *))

static moe_status reserve_tokens(moe_layer *L, int T) {
    if (T <= L->max_tokens) return MOE_OK;
    const moe_config *c = &L->cfg;
    size_t A = (size_t)T * c->top_k, d = c->d_model, E = c->num_experts;
    const size_t count[] = {T * d, A * d, A * d, A * d, A * d, A, T * E, T * E};
    _Static_assert(sizeof count / sizeof *count == NUM_PTRS(token_buffers), "one count per buffer");
    L->max_tokens = 0;
    moe_routing_free(&L->routing);
    moe_status st = realloc_all(&L->tok, NUM_PTRS(token_buffers), count);
    if (st == MOE_OK) st = moe_routing_alloc(&L->routing, T, c->num_experts, c->top_k, c->ep_size);
    if (st == MOE_OK) L->max_tokens = T;
    return st;
}

static moe_status reserve_rows(moe_layer *L, int N) {
    if (N <= L->max_rows) return MOE_OK;
    size_t d = L->cfg.d_model, f = L->cfg.d_ff, n = N;
    const size_t count[] = {n * d, n * d, n * f, n * f, n * f, n * d, n * d, n * d, n * f, n * f};
    _Static_assert(sizeof count / sizeof *count == NUM_PTRS(row_buffers), "one count per buffer");
    L->max_rows = 0;
    moe_status st = realloc_all(&L->rows, NUM_PTRS(row_buffers), count);
    if (st == MOE_OK) L->max_rows = N;
    return st;
}

moe_status moe_layer_create(const moe_config *cfg, const moe_parallel *par, moe_layer **out_layer) {
    if (!out_layer) return MOE_ERR_INVALID_ARG;
    *out_layer = NULL;
    moe_status st = moe_config_validate(cfg);
    if (st != MOE_OK) return st;
    if (par && par->ep_size != cfg->ep_size) return MOE_ERR_INVALID_CONFIG;
    if (!par && cfg->ep_size != 1) return MOE_ERR_INVALID_CONFIG;
    moe_layer *L = calloc(1, sizeof *L);
    if (!L) return MOE_ERR_OUT_OF_MEMORY;
    L->cfg = *cfg;
    L->num_local_experts = cfg->num_experts / cfg->ep_size;
    if (!par && (st = moe_parallel_create_self(&L->owned_par)) != MOE_OK) return free(L), st;
    L->par = par ? par : L->owned_par;
    int widest = cfg->d_model > cfg->d_ff ? cfg->d_model : cfg->d_ff;
    widest = widest > cfg->num_experts ? widest : cfg->num_experts;
    L->expert_bias = calloc(cfg->num_experts, sizeof(moe_real));
    L->expected_recv = calloc((size_t)cfg->num_experts, sizeof(int));
    L->wgrad_scratch = malloc((size_t)cfg->d_ff * cfg->d_model * sizeof(moe_real));
    st = L->expert_bias && L->expected_recv && L->wgrad_scratch ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = gemm_rows_plan_init(&L->gemm, cfg->layout_invariant, widest);
    if (st == MOE_OK) st = moe_dispatch_plan_alloc(&L->plan, cfg->ep_size, L->num_local_experts);
    if (st != MOE_OK) return moe_layer_destroy(L), st;
    *out_layer = L;
    return MOE_OK;
}

void moe_layer_destroy(moe_layer *L) {
    if (!L) return;
    free_all(&L->tok, NUM_PTRS(token_buffers));
    free_all(&L->rows, NUM_PTRS(row_buffers));
    moe_routing_free(&L->routing);
    moe_global_routing_free(&L->global);
    moe_dispatch_plan_free(&L->plan);
    moe_parallel_destroy(L->owned_par);
    free(L->expert_bias);
    gemm_rows_plan_free(&L->gemm);
    free(L->wgrad_scratch);
    free(L->expected_recv);
    free(L);
}

/* After a failed exchange the job cannot go on; say where this rank was and what it meant to move, so
 * that the messages of all ranks together show who disagreed or who never arrived. */
static moe_status exchange_failed(const moe_layer *L, const char *phase, moe_status st, int have_counts) {
    if (st == MOE_OK || st == MOE_ERR_OUT_OF_MEMORY) return st;
    const moe_parallel *p = L->par;
    fprintf(stderr, "moe: layer %d, world rank %d (EP rank %d of %d): %s failed (%s) after %ld completed steps\n",
            L->cfg.layer_index, p->world_rank, p->ep_rank, p->ep_size, phase, moe_status_string(st), L->completed_steps);
    if (!have_counts) return st;
    fprintf(stderr, "moe:   rank %d sends rows per expert:", p->world_rank);
    for (int e = 0; e < L->cfg.num_experts; e++) fprintf(stderr, " %d", L->routing.num_tokens_per_expert[e]);
    fprintf(stderr, "\nmoe:   rank %d expects rows per (EP rank, local expert):", p->world_rank);
    for (int i = 0; i < p->ep_size * L->num_local_experts; i++) fprintf(stderr, " %d", L->expected_recv[i]);
    fprintf(stderr, "\n");
    return st;
}

/* Copies the forced choices after checking them: ids in [0, E), k distinct ids per token. */
static moe_status use_forced_experts(moe_layer *L, int T) {
    const int E = L->cfg.num_experts, k = L->cfg.top_k;
    const int *forced = L->forced_experts;
    L->forced_experts = NULL;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int e = forced[t * k + j];
            if (e < 0 || e >= E) return MOE_ERR_INVALID_ARG;
            for (int i = 0; i < j; i++)
                if (forced[t * k + i] == e) return MOE_ERR_INVALID_ARG;
        }
    memcpy(L->routing.expert, forced, (size_t)T * k * sizeof(int));
    return MOE_OK;
}

/* Router: logits -> scores -> top-k -> gates -> capacity (global) -> layout. */
static moe_status route(moe_layer *L, const moe_layer_weights *w, int T) {
    const moe_config *c = &L->cfg;
    moe_routing *r = &L->routing;
    int E = c->num_experts, k = c->top_k;
    r->num_tokens = T;
    moe_status st = router_logits_cpu(&L->gemm, L->tok.x, w->router_w, T, c->d_model, E, r->logits);
    if (st != MOE_OK) return st;
    router_scores_cpu(c->score_func, r->logits, T, E, r->scores);
    const moe_real *select = r->scores;
    if (c->score_func == MOE_SCORE_SIGMOID) {
        for (size_t i = 0; i < (size_t)T * E; i++) r->select_scores[i] = r->scores[i] + L->expert_bias[i % E];
        select = r->select_scores;
    }
    if (L->forced_experts) { /* replay: the choices come from outside, the gates from this router's scores */
        st = use_forced_experts(L, T);
        if (st != MOE_OK) return st;
    } else {
        router_topk_cpu(select, T, E, k, r->expert);
    }
    router_gates_cpu(r->scores, r->expert, T, E, k, c->renormalize, r->expert_score, r->gate);
    st = moe_global_capacity(L->par, c->capacity_factor, c->drop_priority, r, &L->global);
    if (st != MOE_OK) return exchange_failed(L, "the global capacity exchange", st, 0);
    L->num_tokens_global = L->global.routing.num_tokens;
    router_dispatch_layout_cpu(r);
    return MOE_OK;
}

/* This rank's share of the aux and z losses, summed over the world. */
static moe_status router_losses(moe_layer *L) {
    const moe_config *c = &L->cfg;
    const moe_routing *r = &L->routing;
    double loss[2] = {
        router_load_balance_loss_cpu(c->score_func, r->scores, r->num_selected_per_expert, r->num_tokens,
                                     L->num_tokens_global, c->num_experts, c->top_k),
        router_z_loss_cpu(r->logits, r->num_tokens, L->num_tokens_global, c->num_experts),
    };
    moe_status st = L->par->world->ops->allreduce_sum_f64(L->par->world, loss, 2);
    L->aux_loss = loss[0], L->z_loss = loss[1];
    return exchange_failed(L, "the router-loss all-reduce", st, 1);
}

moe_status moe_layer_forward(moe_layer *L, const moe_layer_weights *w, const moe_real *x, int num_tokens,
                             moe_real *out, moe_layer_stats *stats) {
    if (!L || !w || !x || !out || num_tokens < 1) return MOE_ERR_INVALID_ARG;
    L->has_forward = 0;
    moe_status st = reserve_tokens(L, num_tokens);
    if (st != MOE_OK) return st;
    const moe_config *c = &L->cfg;
    const int T = num_tokens, d = c->d_model, k = c->top_k;
    moe_routing *r = &L->routing;
    moe_comm *ep = L->par->ep;
    memcpy(L->tok.x, x, (size_t)T * d * sizeof(moe_real));
    if ((st = route(L, w, T)) != MOE_OK) return st;

    permute_rows_cpu(L->tok.x, r->perm_token, r->num_kept, d, L->tok.xp);
    moe_global_expected_recv_counts(L->par, &L->global, L->expected_recv);
    st = moe_dispatch_plan_exchange(ep, r->num_tokens_per_expert, L->expected_recv, c->layer_index, &L->plan);
    if (st != MOE_OK) return exchange_failed(L, "the counts exchange", st, 1);
    if ((st = reserve_rows(L, L->plan.num_recv)) != MOE_OK) return st;
    row_buffers *b = &L->rows;
    st = moe_dispatch_rows(ep, &L->plan, L->tok.xp, d, b->staging, b->x);
    if (st != MOE_OK) return exchange_failed(L, "the forward dispatch", st, 1);
    expert_ffn_forward_cpu(w, L->num_local_experts, d, c->d_ff, L->plan.expert_offset, b->x, b->h1, b->h3, b->act,
                           b->y, &L->gemm);
    st = moe_combine_rows(ep, &L->plan, b->y, d, b->staging, L->tok.y);
    if (st != MOE_OK) return exchange_failed(L, "the forward combine", st, 1);
    combine_rows_cpu(L->tok.y, r->slot, r->gate, T, k, d, out);

    if ((st = router_losses(L)) != MOE_OK) return st;
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
        stats->num_tokens_global = L->num_tokens_global;
        stats->num_rows_received = L->plan.num_recv;
    }
    return MOE_OK;
}

moe_status moe_layer_backward(moe_layer *L, const moe_layer_weights *w, const moe_real *dout, moe_real *dx,
                              moe_layer_weights *grads) {
    if (!L || !w || !dout || !grads) return MOE_ERR_INVALID_ARG;
    if (!L->has_forward) return MOE_ERR_NO_FORWARD;
    const moe_config *c = &L->cfg;
    const moe_routing *r = &L->routing;
    const int T = r->num_tokens, Tg = L->num_tokens_global, d = c->d_model, E = c->num_experts, k = c->top_k;
    token_buffers *t = &L->tok;
    row_buffers *b = &L->rows;
    moe_comm *ep = L->par->ep;

    /* Experts: dL/dy and dL/dgate here, dL/dy travels to the experts, dL/dx of their rows travels back. */
    combine_rows_backward_cpu(dout, t->y, r->slot, r->gate, T, k, d, t->dy, t->dgate);
    moe_status st = moe_dispatch_rows(ep, &L->plan, t->dy, d, b->staging, b->dy);
    if (st != MOE_OK) return exchange_failed(L, "the backward dispatch", st, 1);
    expert_ffn_backward_cpu(w, grads, L->num_local_experts, d, c->d_ff, L->plan.segment_start, L->plan.ep_size, b->x,
                            b->h1, b->h3, b->act, b->dy, b->dh1, b->dh3, b->dx, L->wgrad_scratch, &L->gemm);
    st = moe_combine_rows(ep, &L->plan, b->dx, d, b->staging, t->dxp);
    if (st != MOE_OK) return exchange_failed(L, "the backward combine", st, 1);

    /* Router: gates and the balance loss give dL/dscores; scores and the z-loss give dL/dlogits. */
    memset(t->dscores, 0, (size_t)T * E * sizeof(moe_real));
    router_gates_backward_cpu(r->scores, r->expert, r->gate, t->dgate, T, E, k, c->renormalize, t->dscores);
    router_load_balance_loss_backward_cpu(c->score_func, r->scores, r->num_selected_per_expert, T, Tg, E, k,
                                          c->aux_loss_coef, t->dscores);
    router_scores_backward_cpu(c->score_func, r->scores, t->dscores, T, E, t->dlogits);
    router_z_loss_backward_cpu(r->logits, T, Tg, E, c->z_loss_coef, t->dlogits);
    /* dWr += dlogits^T x (a sum over this rank's tokens; moe_layer_reduce_gradients sums over ranks) */
    moe__gemm(CblasRowMajor, CblasTrans, CblasNoTrans, E, d, T, 1, t->dlogits, E, t->x, d, 1, grads->router_w, d);

    if (dx) {
        /* dx = (unpermute of dxp with unit gates) + dlogits Wr */
        combine_rows_cpu(t->dxp, r->slot, NULL, T, k, d, dx);
        gemm_rows_cpu(&L->gemm, CblasNoTrans, T, d, E, t->dlogits, w->router_w, 1, dx);
    }
    L->completed_steps++;
    return MOE_OK;
}

moe_status moe_layer_reduce_gradients(moe_layer *L, moe_layer_weights *grads) {
    if (!L || !grads) return MOE_ERR_INVALID_ARG;
    const moe_config *c = &L->cfg;
    size_t router_count = (size_t)c->num_experts * c->d_model;
    size_t expert_count = 3 * (size_t)L->num_local_experts * c->d_ff * c->d_model;
    moe_comm *world = L->par->world, *dp = L->par->expert_dp;
    /* the views of moe_layer_weights_view: w1, w3, w2 are one region after the router */
    if (grads->w3 != grads->w1 + expert_count / 3 || grads->w2 != grads->w3 + expert_count / 3)
        return MOE_ERR_INVALID_ARG;
    moe_status st = world->ops->allreduce_sum_real(world, grads->router_w, router_count);
    if (st == MOE_OK) st = dp->ops->allreduce_sum_real(dp, grads->w1, expert_count);
    return exchange_failed(L, "the gradient all-reduce", st, 0);
}

moe_real *moe_layer_expert_bias(moe_layer *L) { return L ? L->expert_bias : NULL; }

moe_status moe_layer_force_routing(moe_layer *L, const int *experts) {
    if (!L) return MOE_ERR_INVALID_ARG;
    L->forced_experts = experts;
    return MOE_OK;
}

const int *moe_layer_global_routing(const moe_layer *L, int *num_tokens_global) {
    if (!L || !L->has_forward) return NULL;
    *num_tokens_global = L->global.routing.num_tokens;
    return L->global.routing.expert;
}

moe_status moe_layer_update_expert_bias(moe_layer *L) {
    if (!L) return MOE_ERR_INVALID_ARG;
    if (L->cfg.score_func != MOE_SCORE_SIGMOID) return MOE_ERR_INVALID_CONFIG;
    if (!L->has_forward) return MOE_ERR_NO_FORWARD;
    const moe_routing *r = &L->routing;
    /* global counts over the global batch: every rank makes the same update */
    double mean = (double)L->num_tokens_global * r->top_k / r->num_experts;
    for (int e = 0; e < r->num_experts; e++) {
        double n = r->num_selected_per_expert[e];
        L->expert_bias[e] += L->cfg.bias_update_rate * (moe_real)((n < mean) - (n > mean));
    }
    return MOE_OK;
}

const moe_routing *moe__layer_routing(const moe_layer *L) { return L && L->has_forward ? &L->routing : NULL; }
