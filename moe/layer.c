/* layer.c — one MoE layer on one rank of any expert-parallel layout, on any backend (moe/backend.h):
 *   route (local) -> capacity (global) -> layout -> permute -> dispatch (EP all-to-all)
 *   -> SwiGLU experts (this rank's) -> combine (reverse all-to-all) -> weighted sum over k
 * and its backward along the same routes. Orchestration only: the steps are the backend's (CPU or CUDA),
 * the exchanges alltoall/'s. With a world of one the exchanges are copies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/dispatch.h"
#include "core/fail.h"
#include "moe/backend.h"
#include "moe/global_routing.h"
#include "moe/layer_internal.h"

/* Buffers for this rank's T tokens, A = T*k assignment rows, in layout (send) order, in the backend's
 * memory. "row" buffers hold backend->row_elem bytes per value (moe/backend.h). */
typedef struct {
    void *x;     /* [T, d] moe_real  copy of the input (router weight gradient)                */
    void *xp;    /* [A, d] row       input rows in send order                                  */
    void *y;     /* [A, d] row       expert outputs, back from the combine, in send order      */
    void *dy;    /* [A, d] row       dL/dy in send order                                       */
    void *dxp;   /* [A, d] row       dL/dxp back from the experts, in send order               */
    void *dgate; /* [A]    moe_real                                                            */
} token_buffers;

/* Buffers for the N rows this rank's experts received, expert-major, in the backend's memory. */
typedef struct {
    void *staging; /* [N, d] peer-major landing zone of the exchanges */
    void *x;       /* [N, d] expert inputs                            */
    void *y;       /* [N, d] expert outputs                           */
    void *dy, *dx; /* [N, d]                                          */
} row_buffers;

/* Host copies of what the global capacity rule reads and writes (moe/global_routing.h). */
typedef struct {
    int *expert;            /* [T*k] */
    moe_real *expert_score; /* [T*k] */
    unsigned char *kept;    /* [T*k] */
} host_choices;

struct moe_layer {
    moe_config cfg;
    const moe_parallel *par;
    moe_parallel *owned_par; /* a world of one, when the caller gave none */
    const moe_backend_ops *be; /* where the steps run: par->backend, or the CPU */
    moe_backend *b;
    int num_local_experts;
    int max_tokens, max_rows; /* what token_buffers and row_buffers hold */
    int has_forward;
    const int *forced_experts; /* [T*k] routing to use instead of top-k in the next forward, or NULL */
    long completed_steps;  /* forward+backward pairs done, for failure messages */
    int num_tokens_global;
    double aux_loss, z_loss;
    moe_real *expert_bias; /* [E] sigmoid routing's selection bias (host) */
    int *expected_recv;    /* [ep * E_local] */
    moe_routing routing;   /* per-token arrays in the backend's memory, counts on the host */
    host_choices host;
    moe_global_routing global;
    moe_dispatch_plan plan;
    token_buffers tok;
    row_buffers rows;
};

#define NUM_PTRS(s) (sizeof(s) / sizeof(void *))

/* (Re)allocates every pointer of a struct made only of void pointers to nbytes[i] in the backend's memory. */
static moe_status realloc_all(moe_layer *L, void *bufs, size_t num_ptrs, const size_t *nbytes) {
    void **p = bufs;
    moe_status st = MOE_OK;
    for (size_t i = 0; i < num_ptrs; i++) {
        L->be->free(L->b, p[i]);
        p[i] = NULL;
        if (st == MOE_OK) st = L->be->alloc(L->b, nbytes[i], &p[i]);
    }
    return st;
}

static void free_all(moe_layer *L, void *bufs, size_t num_ptrs) {
    void **p = bufs;
    for (size_t i = 0; i < num_ptrs; i++) L->be->free(L->b, p[i]), p[i] = NULL;
}

static void free_host_choices(host_choices *h) {
    free(h->expert), free(h->expert_score), free(h->kept);
    memset(h, 0, sizeof *h);
}

static moe_status reserve_tokens(moe_layer *L, int T) {
    if (T <= L->max_tokens) return MOE_OK;
    const moe_config *c = &L->cfg;
    size_t A = (size_t)T * c->top_k, d = c->d_model, real = sizeof(moe_real), row = L->be->row_elem;
    const size_t nbytes[] = {T * d * real, A * d * row, A * d * row, A * d * row, A * d * row, A * real};
    _Static_assert(sizeof nbytes / sizeof *nbytes == NUM_PTRS(token_buffers), "one size per buffer");
    L->max_tokens = 0;
    L->be->routing_free(L->b, &L->routing);
    free_host_choices(&L->host);
    moe_status st = realloc_all(L, &L->tok, NUM_PTRS(token_buffers), nbytes);
    if (st == MOE_OK) st = L->be->routing_alloc(L->b, &L->routing, T, c->num_experts, c->top_k, c->ep_size);
    if (st == MOE_OK) {
        L->host.expert = malloc(A * sizeof(int));
        L->host.expert_score = malloc(A * sizeof(moe_real));
        L->host.kept = malloc(A);
        if (!L->host.expert || !L->host.expert_score || !L->host.kept) st = MOE_ERR_OUT_OF_MEMORY;
    }
    if (st == MOE_OK) L->max_tokens = T;
    return st;
}

static moe_status reserve_rows(moe_layer *L, int N) {
    if (N <= L->max_rows) return MOE_OK;
    size_t n = (size_t)N * L->cfg.d_model * L->be->row_elem;
    const size_t nbytes[] = {n, n, n, n, n};
    _Static_assert(sizeof nbytes / sizeof *nbytes == NUM_PTRS(row_buffers), "one size per buffer");
    L->max_rows = 0;
    moe_status st = realloc_all(L, &L->rows, NUM_PTRS(row_buffers), nbytes);
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
    L->be = L->par->backend ? L->par->backend : &moe_backend_cpu;
    L->expert_bias = calloc(cfg->num_experts, sizeof(moe_real));
    L->expected_recv = calloc((size_t)cfg->num_experts, sizeof(int));
    st = L->expert_bias && L->expected_recv ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = L->be->create(cfg, L->par, &L->b);
    if (st == MOE_OK) st = moe_dispatch_plan_alloc(&L->plan, cfg->ep_size, L->num_local_experts);
    if (st != MOE_OK) return moe_layer_destroy(L), st;
    *out_layer = L;
    return MOE_OK;
}

void moe_layer_destroy(moe_layer *L) {
    if (!L) return;
    if (L->b) {
        free_all(L, &L->tok, NUM_PTRS(token_buffers));
        free_all(L, &L->rows, NUM_PTRS(row_buffers));
        L->be->routing_free(L->b, &L->routing);
        L->be->destroy(L->b);
    }
    free_host_choices(&L->host);
    moe_global_routing_free(&L->global);
    moe_dispatch_plan_free(&L->plan);
    moe_parallel_destroy(L->owned_par);
    free(L->expert_bias);
    free(L->expected_recv);
    free(L);
}

/* After a failed exchange the job cannot go on; say where this rank was and what it meant to move, so
 * that the messages of all ranks together show who disagreed or who never arrived. */
static moe_status exchange_failed(const moe_layer *L, const char *phase, moe_status st, int have_counts) {
    if (st == MOE_OK || st == MOE_ERR_OUT_OF_MEMORY) return st;
    const moe_parallel *p = L->par;
    char counts[2048] = "";
    size_t at = 0;
    if (have_counts) {
        at += (size_t)snprintf(counts + at, sizeof counts - at, " (rank %d sends rows per expert:", p->world_rank);
        for (int e = 0; e < L->cfg.num_experts && at < sizeof counts; e++)
            at += (size_t)snprintf(counts + at, sizeof counts - at, " %d", L->routing.num_tokens_per_expert[e]);
        if (at < sizeof counts) at += (size_t)snprintf(counts + at, sizeof counts - at, "; expects per (EP rank, local expert):");
        for (int i = 0; i < p->ep_size * L->num_local_experts && at < sizeof counts; i++)
            at += (size_t)snprintf(counts + at, sizeof counts - at, " %d", L->expected_recv[i]);
        if (at < sizeof counts) snprintf(counts + at, sizeof counts - at, ")");
    }
    return moe_fail_context(st, "layer %d, world rank %d (EP rank %d of %d): %s failed after %ld completed steps%s",
                            L->cfg.layer_index, p->world_rank, p->ep_rank, p->ep_size, phase, L->completed_steps, counts);
}

/* Checks the forced choices (ids in [0, E), k distinct ids per token) and puts them in r->expert. */
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
    return L->be->upload(L->b, L->routing.expert, forced, (size_t)T * k * sizeof(int));
}

/* Capacity on the global batch: the choices go to the host, every rank gathers them and runs the one rule
 * (moe/global_routing.h), and this rank's kept flags come back. The same code for every backend, so the
 * drops are the same too. */
static moe_status global_capacity(moe_layer *L) {
    const moe_config *c = &L->cfg;
    moe_routing *r = &L->routing;
    size_t A = (size_t)r->num_tokens * c->top_k;
    moe_routing view = *r; /* host counts, host copies of the per-assignment arrays */
    view.expert = L->host.expert, view.expert_score = L->host.expert_score, view.kept = L->host.kept;
    moe_status st = L->be->download(L->b, view.expert, r->expert, A * sizeof(int));
    if (st == MOE_OK && c->capacity_factor > 0 && c->drop_priority == MOE_DROP_BY_SCORE)
        st = L->be->download(L->b, view.expert_score, r->expert_score, A * sizeof(moe_real));
    if (st != MOE_OK) return st;
    st = moe_global_capacity(L->par, c->capacity_factor, c->drop_priority, &view, &L->global);
    if (st != MOE_OK) return exchange_failed(L, "the global capacity exchange", st, 0);
    r->capacity = view.capacity;
    L->num_tokens_global = L->global.routing.num_tokens;
    return L->be->upload(L->b, r->kept, view.kept, A);
}

/* Router: logits -> scores -> top-k (or the forced choices) -> gates -> capacity (global) -> layout. */
static moe_status route(moe_layer *L, const moe_layer_weights *w, int T) {
    moe_routing *r = &L->routing;
    r->num_tokens = T;
    int forced = L->forced_experts != NULL;
    moe_status st = forced ? use_forced_experts(L, T) : MOE_OK;
    if (st == MOE_OK) st = L->be->route(L->b, w, L->tok.x, L->expert_bias, forced, r);
    if (st == MOE_OK) st = global_capacity(L);
    if (st == MOE_OK) st = L->be->dispatch_layout(L->b, r);
    return st;
}

/* This rank's share of the aux and z losses, summed over the world. */
static moe_status router_losses(moe_layer *L) {
    double loss[2];
    moe_status st = L->be->router_losses(L->b, &L->routing, L->num_tokens_global, loss);
    if (st != MOE_OK) return st;
    st = L->par->world->ops->allreduce_sum_f64(L->par->world, loss, 2);
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
    const size_t row_nbytes = (size_t)d * L->be->row_elem;
    const moe_backend_ops *be = L->be;
    moe_routing *r = &L->routing;
    moe_comm *ep = L->par->ep;
    if ((st = be->copy(L->b, L->tok.x, x, (size_t)T * d * sizeof(moe_real))) != MOE_OK) return st; /* for backward */
    if ((st = route(L, w, T)) != MOE_OK) return st;

    if ((st = be->permute(L->b, L->tok.x, r->perm_token, r->num_kept, d, L->tok.xp)) != MOE_OK) return st;
    moe_global_expected_recv_counts(L->par, &L->global, L->expected_recv);
    st = moe_dispatch_plan_exchange(ep, r->num_tokens_per_expert, L->expected_recv, c->layer_index, &L->plan);
    if (st != MOE_OK) return exchange_failed(L, "the counts exchange", st, 1);
    if ((st = reserve_rows(L, L->plan.num_recv)) != MOE_OK) return st;
    row_buffers *b = &L->rows;
    st = moe_dispatch_rows(ep, &L->plan, L->tok.xp, row_nbytes, b->staging, b->x);
    if (st != MOE_OK) return exchange_failed(L, "the forward dispatch", st, 1);
    if ((st = be->experts_forward(L->b, w, L->plan.expert_offset, L->plan.num_recv, b->x, b->y)) != MOE_OK) return st;
    st = moe_combine_rows(ep, &L->plan, b->y, row_nbytes, b->staging, L->tok.y);
    if (st != MOE_OK) return exchange_failed(L, "the forward combine", st, 1);
    if ((st = be->combine(L->b, L->tok.y, r->slot, r->gate, T, k, d, out)) != MOE_OK) return st;

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
    const int T = r->num_tokens, d = c->d_model, k = c->top_k;
    const size_t row_nbytes = (size_t)d * L->be->row_elem;
    const moe_backend_ops *be = L->be;
    token_buffers *t = &L->tok;
    row_buffers *b = &L->rows;
    moe_comm *ep = L->par->ep;

    /* Experts: dL/dy and dL/dgate here, dL/dy travels to the experts, dL/dx of their rows travels back. */
    moe_status st = be->combine_backward(L->b, dout, t->y, r->slot, r->gate, T, k, d, t->dy, t->dgate);
    if (st != MOE_OK) return st;
    st = moe_dispatch_rows(ep, &L->plan, t->dy, row_nbytes, b->staging, b->dy);
    if (st != MOE_OK) return exchange_failed(L, "the backward dispatch", st, 1);
    st = be->experts_backward(L->b, w, grads, L->plan.segment_start, L->plan.ep_size, L->plan.num_recv, b->x, b->dy,
                              b->dx);
    if (st != MOE_OK) return st;
    st = moe_combine_rows(ep, &L->plan, b->dx, row_nbytes, b->staging, t->dxp);
    if (st != MOE_OK) return exchange_failed(L, "the backward combine", st, 1);

    /* dx = (unpermute of dxp with unit gates) + dlogits Wr, the router's part added by router_backward */
    if (dx && (st = be->combine(L->b, t->dxp, r->slot, NULL, T, k, d, dx)) != MOE_OK) return st;
    st = be->router_backward(L->b, w, r, t->x, t->dgate, L->num_tokens_global, grads, dx);
    if (st != MOE_OK) return st;
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
