/* layer.c — one MoE layer on one rank of any expert-parallel layout, on any runtime (moe/layer_ops.h):
 *   route (local) -> capacity (global, router/capacity.h) -> layout -> permute -> dispatch (EP all-to-all)
 *   -> SwiGLU experts (this rank's) -> combine (reverse all-to-all) -> weighted sum over k
 * and its backward along the same routes. Orchestration only: the steps are the runtime's table's, the
 * capacity rule the router's, the exchanges alltoall/'s. With a world of one the exchanges are copies.
 *
 * Takes from alltoall/: the layout's communicators and the dispatch plan; from router/: the routing objects,
 * the global capacity rule and the count check; from moe/: the runtime's memory and the layer table. */
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/dispatch.h"
#include "alltoall/tree_reduce.h"
#include "core/fail.h"
#include "moe/layer_buffers.h"
#include "moe/layer_internal.h"
#include "moe/runtime_backend.h"
#include "moe/shard_tree.h"
#include "router/capacity.h"

/* The buffers of a pass, moe/layer_buffers.h's lists, in the runtime's memory: over this rank's T tokens (A = T k
 * assignment rows, in layout (send) order) and over the N rows its experts received. What each layer keeps from
 * forward for backward is its own (kept_buffers); the rest, and under recompute full also what would be kept
 * (rebuilt by moe_layer_recompute), are runtime slots (moe_runtime_scratch), one for every layer. The pointers are
 * set at the start of each pass (point_token_buffers, point_row_buffers). */
#define BUFFER_FIELD(name, n_rows, elem, slot, kept_below) void *name;
typedef struct {
    MOE_LAYER_TOKEN_BUFFERS(BUFFER_FIELD)
} token_buffers;
typedef struct {
    MOE_LAYER_ROW_BUFFERS(BUFFER_FIELD)
} row_buffers;
#undef BUFFER_FIELD
#define COUNT_ONE(...) +1
enum { ROUTING_ARRAYS = 0 MOE_TOKEN_ROUTING_ARRAYS(COUNT_ONE), ROW_BUFFERS = 0 MOE_LAYER_ROW_BUFFERS(COUNT_ONE),
       TOKEN_BUFFERS = 0 MOE_LAYER_TOKEN_BUFFERS(COUNT_ONE) };
#undef COUNT_ONE

/* What the layer itself allocates and keeps for backward: the lists' buffers kept below cfg.recompute (the others
 * NULL), and dgate. */
typedef struct {
    token_buffers tokens;
    row_buffers rows;
    void *dgate; /* [A] moe_real */
} kept_buffers;

/* Host arrays of the routing (runtime host memory: pinned on CUDA, so the copies to and from them stay
 * queued). */
typedef struct {
    int *expert;            /* [T*k] the top-k choices, for the capacity rule */
    moe_real *expert_score; /* [T*k] their scores (drop by score)           */
    unsigned char *kept;    /* [T*k] the rule's verdict                      */
    int *layout_counts;     /* [E]   the device layout's rows per expert, checked against the rule's */
    int *witness;           /* [E * MOE_COUNT_WITNESS_INTS] sent with the counts (router/capacity.h) */
    int *rows_per_shard;    /* [E * local_shards] the kept rows for expert e from local shard j, at [e * L + j] */
    double *losses;         /* [local_shards * 2] the router losses' shares of each local shard (queued: they land
                             * by the runtime's next synchronisation) */
} host_routing;

struct moe_layer {
    moe_config cfg;
    moe_runtime *rt;
    moe_runtime *owned_rt;     /* the CPU, when the caller gave no runtime */
    const moe_parallel *par;
    moe_parallel *owned_par;   /* a world of one, when the caller gave no layout */
    moe_ranks ranks;
    const moe_layer_ops *steps; /* the runtime's table of the layer's steps */
    moe_layer_state *state;
    int num_local_experts;
    /* cfg.num_shards > 0: this rank's shards of the batch (S / W, in shard order) and the tree that sums the
     * router weight gradient over them (moe/shard_tree.h); else local_shards = 1 and no tree */
    int local_shards;
    moe_shard_tree router_tree;
    int max_tokens, max_rows;  /* what the token and row buffers hold */
    int has_forward;
    int rebuilt;               /* what backward needs is in place: after a forward, or under recompute full after
                                * moe_layer_recompute */
    const int *forced_experts; /* [T*k] routing to use instead of top-k in the next forward, or NULL */
    long completed_steps;      /* forward+backward pairs done, for failure messages */
    moe_nonfinite_finding *finding; /* while checking for NaN (moe_layer_set_checks) */
    double aux_loss, z_loss;
    int defer_finish;          /* moe_layer_defer_finish: the caller finishes each forward (moe_layer_finish_forward) */
    int dropless;              /* moe_layer_set_dropless: no capacity limit, whatever cfg says */
    int pending;               /* a forward's router losses and layout counts queued, not yet finished */
    moe_real *expert_bias;     /* [E] sigmoid routing's selection bias (host): own_bias, or another layer's */
    moe_real *own_bias;
    moe_token_routing tok;
    moe_routing_counts counts;
    host_routing host;
    moe_dispatch_plan plan;
    kept_buffers kept;
    token_buffers buf;
    row_buffers rows;
};

/* Whether forward's x, y and received rows stay for backward (else moe_layer_recompute rebuilds them). */
static int keeps_rows(const moe_layer *L) { return L->cfg.recompute != MOE_RECOMPUTE_FULL; }

#define NUM_PTRS(s) (sizeof(s) / sizeof(void *))

static void free_all(moe_layer *L, void *bufs, size_t num_ptrs) {
    void **p = bufs;
    for (size_t i = 0; i < num_ptrs; i++) moe_runtime_free(L->rt, p[i]), p[i] = NULL;
}

static void free_host(moe_layer *L) {
    void *ptrs[] = {L->host.expert, L->host.expert_score, L->host.kept, L->host.layout_counts, L->host.witness,
                    L->host.rows_per_shard, L->host.losses};
    for (size_t i = 0; i < NUM_PTRS(ptrs); i++) moe_runtime_host_free(L->rt, ptrs[i]);
    memset(&L->host, 0, sizeof L->host);
}

static moe_status alloc_host(moe_layer *L, size_t A) {
    const size_t E = L->cfg.num_experts;
    host_routing *h = &L->host;
    MOE_TRY(moe_runtime_host_alloc(L->rt, A * sizeof(int), (void **)&h->expert));
    MOE_TRY(moe_runtime_host_alloc(L->rt, A * sizeof(moe_real), (void **)&h->expert_score));
    MOE_TRY(moe_runtime_host_alloc(L->rt, A, (void **)&h->kept));
    MOE_TRY(moe_runtime_host_alloc(L->rt, E * sizeof(int), (void **)&h->layout_counts));
    MOE_TRY(moe_runtime_host_alloc(L->rt, E * L->local_shards * sizeof(int), (void **)&h->rows_per_shard));
    MOE_TRY(moe_runtime_host_alloc(L->rt, 2 * L->local_shards * sizeof(double), (void **)&h->losses));
    return moe_runtime_host_alloc(L->rt, E * MOE_COUNT_WITNESS_INTS * sizeof(int), (void **)&h->witness);
}

static moe_status reserve_tokens(moe_layer *L, int T) {
    if (T <= L->max_tokens) return MOE_OK;
    const moe_config *c = &L->cfg;
    const size_t A = (size_t)T * c->top_k, d = c->d_model, real = sizeof(moe_real), row = L->steps->row_elem;
    const size_t E = c->num_experts, k = c->top_k;
    L->max_tokens = 0;
    /* the per-token routing arrays, dgate, then the token buffers each layer keeps, in one regrow */
    void **ptrs[ROUTING_ARRAYS + 1 + TOKEN_BUFFERS];
    size_t nbytes[ROUTING_ARRAYS + 1 + TOKEN_BUFFERS];
    int n = 0;
#define ROUTING_ARRAY(type, name, per_token, what) \
    ptrs[n] = (void **)&L->tok.name, nbytes[n++] = (size_t)T * (per_token) * sizeof(type);
    MOE_TOKEN_ROUTING_ARRAYS(ROUTING_ARRAY)
#undef ROUTING_ARRAY
    ptrs[n] = &L->kept.dgate, nbytes[n++] = A * real;
#define KEPT(name, n_rows, elem, slot, kept_below) \
    if (c->recompute < (kept_below)) ptrs[n] = &L->kept.tokens.name, nbytes[n++] = (size_t)(n_rows) * d * (elem);
    MOE_LAYER_TOKEN_BUFFERS(KEPT)
#undef KEPT
    free_host(L);
    MOE_TRY(moe_runtime_regrow(L->rt, ptrs, nbytes, n));
    MOE_TRY(alloc_host(L, A));
    L->max_tokens = T;
    return MOE_OK;
}

/* A buffer's pointer for a pass: the layer's own when it keeps it, else its runtime slot of `nbytes`. */
#define POINT_BUFFER(to, kept, name, n_rows, elem, slot, kept_below)                                        \
    if (L->cfg.recompute < (kept_below)) (to)->name = (kept)->name;                                         \
    else MOE_TRY(moe_runtime_scratch(L->rt, slot, (size_t)(n_rows) * d * (elem), &(to)->name));

/* buf's pointers for a pass over T tokens (reserve_tokens(T) came first). */
static moe_status point_token_buffers(moe_layer *L, int T) {
    const size_t d = L->cfg.d_model, A = (size_t)T * L->cfg.top_k, real = sizeof(moe_real), row = L->steps->row_elem;
#define POINT(...) POINT_BUFFER(&L->buf, &L->kept.tokens, __VA_ARGS__)
    MOE_LAYER_TOKEN_BUFFERS(POINT)
#undef POINT
    return MOE_OK;
}

/* The received rows a pass's buffers are sized for: with a capacity, the most any step can bring (each local
 * expert's capacity, and no more than every token of the EP group choosing this rank's experts: bounds as long as the
 * batch stays, so no later step allocates); dropless, the rows themselves (T k every step at ep 1; at ep > 1 a step
 * bringing more rows than any before grows them). */
static int reserved_rows(const moe_layer *L, int rows) {
    const long long E = L->num_local_experts, k = L->cfg.top_k < E ? L->cfg.top_k : E;
    const long long by_capacity = E * L->counts.capacity, by_tokens = (long long)L->ranks.ep_size *
                                                                       L->counts.num_tokens * k;
    const long long bound = by_capacity < by_tokens ? by_capacity : by_tokens;
    return L->counts.capacity > 0 && bound > rows && bound <= INT_MAX ? (int)bound : rows;
}

/* rows' pointers for a pass over `rows` received rows, sized for N = reserved_rows: the kept ones grow with the
 * largest N seen (a forward's; its backward asks for the same, which keeps them), the others are slots. */
static moe_status point_row_buffers(moe_layer *L, int rows) {
    const size_t d = L->cfg.d_model, row = L->steps->row_elem;
    const int N = reserved_rows(L, rows);
    if (N > L->max_rows) {
        void **ptrs[ROW_BUFFERS];
        size_t nbytes[ROW_BUFFERS];
        int n = 0;
#define KEPT(name, n_rows, elem, slot, kept_below) \
    if (L->cfg.recompute < (kept_below)) ptrs[n] = &L->kept.rows.name, nbytes[n++] = (size_t)(n_rows) * d * (elem);
        MOE_LAYER_ROW_BUFFERS(KEPT)
#undef KEPT
        L->max_rows = 0;
        if (n) MOE_TRY(moe_runtime_regrow(L->rt, ptrs, nbytes, n));
        L->max_rows = N;
    }
#define POINT(...) POINT_BUFFER(&L->rows, &L->kept.rows, __VA_ARGS__)
    MOE_LAYER_ROW_BUFFERS(POINT)
#undef POINT
    return MOE_OK;
}
#undef POINT_BUFFER

/* The shard trees' additions: the layer table's add. */
static moe_status layer_add(void *ctx, const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    moe_layer *L = ctx;
    return L->steps->add(L->state, a, b, n, y);
}

/* cfg.num_shards: S / W local shards, which needs W a power of two dividing S. */
static moe_status local_shards_of(moe_layer *L) {
    if (!L->cfg.num_shards) return MOE_OK;
    return moe_shard_tree_local_shards(L->cfg.num_shards, moe_comm_size(moe_parallel_stage(L->par)), &L->local_shards);
}

moe_status moe_layer_create(const moe_config *cfg, moe_runtime *rt, const moe_parallel *par, moe_layer **out_layer) {
    if (!out_layer) return MOE_ERR_INVALID_ARG;
    *out_layer = NULL;
    const int ep = par ? moe_parallel_ranks(par).ep_size : 1; /* the experts are sharded over the layout's ep */
    const char *problem = moe_config_problem(cfg);
    if (!problem) problem = moe_config_ep_problem(cfg, ep);
    if (problem) return moe_fail(cfg ? MOE_ERR_INVALID_CONFIG : MOE_ERR_INVALID_ARG, "%s", problem);
    moe_layer *L = calloc(1, sizeof *L);
    if (!L) return MOE_ERR_OUT_OF_MEMORY;
    L->cfg = *cfg;
    L->num_local_experts = moe_config_num_local_experts(cfg, ep);
    moe_status st = MOE_OK;
    if (!rt && (st = moe_runtime_create_cpu(&L->owned_rt)) != MOE_OK) return free(L), st;
    if (!par && (st = moe_parallel_create_self(&L->owned_par)) != MOE_OK)
        return moe_runtime_destroy(L->owned_rt), free(L), st;
    L->rt = rt ? rt : L->owned_rt;
    L->par = par ? par : L->owned_par;
    L->ranks = moe_parallel_ranks(L->par);
    L->steps = L->rt->layer;
    L->local_shards = 1;
    st = local_shards_of(L);
    L->expert_bias = L->own_bias = calloc(cfg->num_experts, sizeof(moe_real));
    if (st == MOE_OK)
        st = L->expert_bias ? moe_routing_counts_alloc(&L->counts, cfg->num_experts) : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = L->steps->create(cfg, L->num_local_experts, L->rt, &L->state);
    if (st == MOE_OK)
        st = moe_dispatch_plan_alloc(&L->plan, ep, L->num_local_experts, MOE_COUNT_WITNESS_INTS, L->local_shards);
    if (st == MOE_OK && cfg->num_shards)
        st = moe_shard_tree_init(&L->router_tree, L->rt, layer_add, L, L->local_shards,
                                 (size_t)cfg->num_experts * cfg->d_model);
    if (st != MOE_OK) return moe_layer_destroy(L), st;
    *out_layer = L;
    return MOE_OK;
}

void moe_layer_destroy(moe_layer *L) {
    if (!L) return;
    if (L->rt) {
        free_all(L, &L->tok, NUM_PTRS(moe_token_routing));
        free_all(L, &L->kept, NUM_PTRS(kept_buffers));
        free_host(L);
    }
    if (L->state) L->steps->destroy(L->state);
    moe_shard_tree_free(&L->router_tree);
    moe_routing_counts_free(&L->counts);
    moe_dispatch_plan_free(&L->plan);
    moe_parallel_destroy(L->owned_par);
    moe_runtime_destroy(L->owned_rt);
    free(L->own_bias);
    free(L);
}

/* After a failed exchange the job cannot go on; say where this rank was and what it meant to send, so that
 * the messages of all ranks together show who disagreed or who never arrived. */
static moe_status exchange_failed(const moe_layer *L, const char *phase, moe_status st, int have_counts) {
    if (st == MOE_OK || st == MOE_ERR_OUT_OF_MEMORY) return st;
    char counts[2048] = "";
    size_t at = 0;
    if (have_counts) {
        at += (size_t)snprintf(counts, sizeof counts, " (rank %d sends rows per expert:", L->ranks.world_rank);
        for (int e = 0; e < L->cfg.num_experts && at < sizeof counts; e++)
            at += (size_t)snprintf(counts + at, sizeof counts - at, " %d", L->counts.num_tokens_per_expert[e]);
        if (at < sizeof counts) snprintf(counts + at, sizeof counts - at, ")");
    }
    return moe_fail_context(st, "layer %d, world rank %d (EP rank %d of %d): %s failed after %ld completed steps%s",
                            L->cfg.layer_index, L->ranks.world_rank, L->ranks.ep_rank, L->ranks.ep_size, phase,
                            L->completed_steps, counts);
}

/* Checks the forced choices (ids in [0, E), k distinct ids per token) and puts them in tok.expert. */
static moe_status use_forced_experts(moe_layer *L, int T) {
    const int E = L->cfg.num_experts, k = L->cfg.top_k;
    const int *forced = L->forced_experts;
    L->forced_experts = NULL;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int e = forced[t * k + j];
            if (e < 0 || e >= E)
                return moe_fail(MOE_ERR_INVALID_ARG, "forced routing: token %d picks expert %d of %d", t, e, E);
            for (int i = 0; i < j; i++)
                if (forced[t * k + i] == e)
                    return moe_fail(MOE_ERR_INVALID_ARG, "forced routing: token %d picks expert %d twice", t, e);
        }
    return moe_runtime_upload(L->rt, L->tok.expert, forced, (size_t)T * k * sizeof(int));
}

/* Router: logits -> scores -> top-k (or the forced choices) -> gates, then capacity over the stage on the
 * host copies of the choices (the forward's first host sync on a GPU), then the layout. */
static moe_status route(moe_layer *L, const moe_layer_weights *w, int T) {
    const moe_config *c = &L->cfg;
    const float capacity_factor = L->dropless ? 0 : c->capacity_factor;
    const int forced = L->forced_experts != NULL,
              by_score = capacity_factor > 0 && c->drop_priority == MOE_DROP_BY_SCORE;
    if (forced) MOE_TRY(use_forced_experts(L, T));
    MOE_TRY(L->steps->route(L->state, w, L->buf.x, L->expert_bias, forced, &L->tok, T));
    MOE_TRY(L->steps->choices_to_host(L->state, &L->tok, T, by_score, L->host.expert, L->host.expert_score,
                                      &L->counts.nonfinite_local));
    L->counts.num_tokens = T;
    moe_status st = moe_router_global_capacity(moe_parallel_stage(L->par), capacity_factor, c->drop_priority,
                                               c->num_experts, c->top_k, L->host.expert, L->host.expert_score,
                                               L->host.kept, &L->counts);
    if (st != MOE_OK) return exchange_failed(L, "the global capacity exchange", st, 0);
    /* every rank learns of non-finite logits from the same scan, and every rank stops here */
    if (L->counts.nonfinite_local)
        return moe_fail_context(MOE_ERR_NONFINITE, "layer %d, world rank %d", c->layer_index, L->ranks.world_rank);
    if (L->counts.nonfinite_ranks)
        return moe_fail(MOE_ERR_NONFINITE, "layer %d: the router logits of %d other rank(s) are non-finite (NaN or Inf)",
                        c->layer_index, L->counts.nonfinite_ranks);
    MOE_TRY(L->steps->kept_to_device(L->state, L->host.kept, &L->tok, T));
    return L->steps->dispatch_layout(L->state, &L->tok, T, L->host.layout_counts);
}

/* The first token of local shard j of T tokens (j = local_shards: T). Training splits a rank's sequences evenly
 * (the trainer checks that the batch divides into the shards); any other forward (sampling one sequence) is cut
 * the same way, token by token. */
static int shard_begin(const moe_layer *L, int j, int T) { return (int)((long long)j * T / L->local_shards); }

/* host.rows_per_shard: this rank's kept rows per (expert, local shard); an expert's rows are in token order, so
 * they arrive split by shard. */
static void count_rows_per_shard(moe_layer *L) {
    const int T = L->counts.num_tokens, k = L->cfg.top_k, LS = L->local_shards;
    int *rows = L->host.rows_per_shard;
    memset(rows, 0, (size_t)L->cfg.num_experts * LS * sizeof(int));
    for (int j = 0; j < LS; j++)
        for (int a = shard_begin(L, j, T) * k; a < shard_begin(L, j + 1, T) * k; a++)
            if (L->host.kept[a]) rows[L->host.expert[a] * LS + j]++;
}

/* The counts each peer announces, checked against the capacity rule, then the plan. */
static moe_status plan_exchange(moe_layer *L) {
    moe_router_count_witness(&L->counts, L->cfg.num_experts, L->host.witness);
    if (L->local_shards > 1) count_rows_per_shard(L);
    moe_status st = moe_dispatch_plan_exchange(moe_parallel_ep(L->par), L->counts.num_tokens_per_expert,
                                               L->host.witness, L->host.rows_per_shard, &L->plan);
    if (st == MOE_OK)
        st = moe_router_check_announced(&L->plan, &L->counts, L->cfg.drop_priority, L->ranks, L->cfg.layer_index);
    return exchange_failed(L, "the counts exchange", st, 1);
}

/* The device layout must hold exactly the rows the rule kept (its counts arrive by the runtime's next
 * synchronisation on a GPU, so the check comes when the forward is finished: moe_layer_finish_forward). */
static moe_status check_layout_counts(const moe_layer *L) {
    for (int e = 0; e < L->cfg.num_experts; e++)
        if (L->host.layout_counts[e] != L->counts.num_tokens_per_expert[e])
            return moe_fail(MOE_ERR_COUNT_MISMATCH,
                            "layer %d, world rank %d: the dispatch layout holds %d rows for expert %d but the capacity "
                            "rule kept %d (a %s layout bug)", L->cfg.layer_index, L->ranks.world_rank,
                            L->host.layout_counts[e], e, L->counts.num_tokens_per_expert[e], L->steps->name);
    return MOE_OK;
}

/* The per-token routing arrays of tokens [first, ...): a view into tok. */
static moe_token_routing tokens_from(const moe_layer *L, int first) {
    const size_t E = L->cfg.num_experts, k = L->cfg.top_k, t = (size_t)first;
    (void)E, (void)k;
    moe_token_routing v;
#define SHIFT(type, name, per_token, what) v.name = L->tok.name + t * (per_token);
    MOE_TOKEN_ROUTING_ARRAYS(SHIFT)
#undef SHIFT
    return v;
}

/* This rank's shares of the aux and z losses queued into host.losses, one per local shard (one in all without
 * shards); they land by the runtime's next synchronisation (moe_layer_finish_forward sums them). */
static moe_status queue_router_losses(moe_layer *L) {
    const int T = L->counts.num_tokens;
    for (int j = 0; j < L->local_shards; j++) {
        const int first = shard_begin(L, j, T);
        const moe_token_routing shard = tokens_from(L, first);
        MOE_TRY(L->steps->router_losses(L->state, &shard, shard_begin(L, j + 1, T) - first,
                                        L->counts.num_selected_per_expert, L->counts.num_tokens_global,
                                        L->host.losses + 2 * j));
    }
    L->pending = 1;
    return MOE_OK;
}

void moe_layer_defer_finish(moe_layer *L, int defer) {
    if (L) L->defer_finish = defer;
}

void moe_layer_set_dropless(moe_layer *L, int dropless) {
    if (L) L->dropless = dropless;
}

/* Every view of w set (a NULL one crashed the OpenBLAS engine, and oneDNN's failed as "status 2": a probe). */
static int weights_whole(const moe_layer_weights *w) { return w->router_w && w->w1 && w->w3 && w->w2; }

moe_status moe_layer_finish_forward(moe_layer *L, moe_layer_stats *stats) {
    if (!L) return MOE_ERR_INVALID_ARG;
    if (!L->pending) return MOE_OK;
    L->pending = 0;
    /* A layout bug's detector, agreed in the losses' all-reduce (a third value: the ranks that found one), so that
     * every rank of the stage fails at this point together: before, the rank that found it left and the others waited
     * in the all-reduce for the exchange watchdog. */
    const moe_status counted = check_layout_counts(L);
    double loss[3] = {0, 0, counted != MOE_OK};
    moe_status st = MOE_OK;
    if (!L->cfg.num_shards) {
        memcpy(loss, L->host.losses, 2 * sizeof *loss);
        st = moe_comm_allreduce_sum_f64(moe_parallel_stage(L->par), loss, 3);
    } else { /* the shards' shares in the shard tree, then the tree all-reduce */
        moe_tree_acc acc;
        MOE_TRY(moe_tree_acc_init(&acc, MOE_TREE_F64, L->local_shards, 2));
        for (int j = 0; j < L->local_shards && st == MOE_OK; j++) st = moe_tree_acc_push(&acc, L->host.losses + 2 * j);
        if (st == MOE_OK) memcpy(loss, moe_tree_acc_sum(&acc), 2 * sizeof *loss);
        moe_tree_acc_free(&acc);
        MOE_TRY(st);
        st = moe_comm_allreduce_tree_f64(moe_parallel_stage(L->par), loss, 3);
    }
    if (st != MOE_OK) return exchange_failed(L, "the router-loss all-reduce", st, 1);
    if (counted != MOE_OK) return counted;
    if (loss[2] > 0)
        return moe_fail(MOE_ERR_COUNT_MISMATCH, "layer %d, world rank %d: %g other rank(s) of the stage found their "
                        "dispatch layout disagreeing with the capacity rule (their messages say where)",
                        L->cfg.layer_index, L->ranks.world_rank, loss[2]);
    L->aux_loss = loss[0], L->z_loss = loss[1];
    if (stats) {
        stats->aux_loss = L->aux_loss;
        stats->z_loss = L->z_loss;
        stats->weighted_loss = L->cfg.aux_loss_coef * L->aux_loss + L->cfg.z_loss_coef * L->z_loss;
    }
    return MOE_OK;
}

/* While checking (moe_layer_set_checks): records the first NaN or Inf of count values (moe_real, or the row
 * type when rows is set) once, naming what they are; never fails for it, so every rank goes on alike. */
static moe_status watch(moe_layer *L, const void *data, size_t count, int rows, const char *what) {
    if (!L->finding || L->finding->found) return MOE_OK;
    long long first;
    MOE_TRY(L->steps->find_nonfinite(L->state, data, count, rows, &first));
    if (first < 0) return L->finding->looks++, MOE_OK;
    L->finding->found = 1, L->finding->order = L->finding->looks;
    snprintf(L->finding->where, sizeof L->finding->where,
             "layer %d, world rank %d: %s holds the first NaN or Inf (element %lld)", L->cfg.layer_index,
             L->ranks.world_rank, what, first);
    return MOE_OK;
}

/* watch() over each local expert's rows of a row buffer in expert-major order, then over each expert's slice
 * of a weight-shaped buffer when w is given. */
static moe_status watch_experts(moe_layer *L, const void *rows, const char *rows_what, const moe_layer_weights *w,
                                const char *w_what) {
    if (!L->finding || L->finding->found) return MOE_OK;
    const int EL = L->num_local_experts, first = L->ranks.ep_rank * EL, d = L->cfg.d_model;
    const size_t row_nbytes = (size_t)d * L->steps->row_elem, per = (size_t)L->cfg.d_ff * d;
    char what[160];
    for (int le = 0; le < EL; le++) {
        const int begin = L->plan.expert_offset[le], end = L->plan.expert_offset[le + 1];
        snprintf(what, sizeof what, "%s of expert %d", rows_what, first + le);
        MOE_TRY(watch(L, (const char *)rows + (size_t)begin * row_nbytes, (size_t)(end - begin) * d, 1, what));
        const moe_real *parts[3] = {w ? w->w1 : NULL, w ? w->w3 : NULL, w ? w->w2 : NULL};
        static const char *const names[3] = {"w1", "w3", "w2"};
        for (int m = 0; m < 3 && w; m++) {
            snprintf(what, sizeof what, "%s %s of expert %d", w_what, names[m], first + le);
            MOE_TRY(watch(L, parts[m] + le * per, per, 0, what));
        }
    }
    return MOE_OK;
}

moe_status moe_layer_set_checks(moe_layer *L, moe_nonfinite_finding *finding) {
    if (!L) return MOE_ERR_INVALID_ARG;
    L->finding = finding;
    return MOE_OK;
}

/* One EP rank: its exchanges would copy rows to itself in the same order (dispatch.c: the reorder is the identity),
 * so the rows are written where the other side reads them — the permute into the experts' input rows, the experts'
 * outputs and input gradients into the token side's buffers — and no exchange runs. The same bits, two copies of
 * every row less per pass. */
static int exchange_is_local(const moe_layer *L) { return moe_comm_size(moe_parallel_ep(L->par)) == 1; }

/* buf.x's rows permuted into send order (buf.xp) for the exchange, before the counts exchange so that a GPU permutes
 * while the host exchanges; at one EP rank run_experts permutes them into the experts' rows instead. */
static moe_status permute_to_send(moe_layer *L) {
    if (exchange_is_local(L)) return MOE_OK;
    return L->steps->permute(L->state, L->buf.x, L->tok.perm_token, L->counts.total_kept, L->buf.xp);
}

/* The permuted rows (buf.xp) to this rank's experts and their outputs back, in send order (buf.y), by the exchange
 * plan: the forward's, or moe_layer_recompute's again. `pass` names it in failure messages. */
static moe_status run_experts(moe_layer *L, const moe_layer_weights *w, const char *pass) {
    const size_t row_nbytes = (size_t)L->cfg.d_model * L->steps->row_elem;
    moe_comm *ep = moe_parallel_ep(L->par);
    const int local = exchange_is_local(L);
    char what[64];
    MOE_TRY(point_row_buffers(L, L->plan.num_recv));
    if (L->counts.capacity > 0 && L->steps->reserve_rows) { /* an expert's rows: its capacity, the group's tokens */
        const long long group_tokens = (long long)L->ranks.ep_size * L->counts.num_tokens;
        const int expert_rows = group_tokens < L->counts.capacity ? (int)group_tokens : L->counts.capacity;
        MOE_TRY(L->steps->reserve_rows(L->state, reserved_rows(L, L->plan.num_recv), expert_rows));
    }
    row_buffers *b = &L->rows;
    if (local) MOE_TRY(L->steps->permute(L->state, L->buf.x, L->tok.perm_token, L->counts.total_kept, b->x));
    moe_status st = local ? MOE_OK : moe_dispatch_rows(ep, &L->plan, L->buf.xp, row_nbytes, b->staging, b->x);
    snprintf(what, sizeof what, "the %s dispatch", pass);
    if (st != MOE_OK) return exchange_failed(L, what, st, 1);
    void *y = local ? L->buf.y : b->y;
    MOE_TRY(L->steps->experts_forward(L->state, w, L->plan.expert_offset, L->plan.num_recv, b->x, y));
    MOE_TRY(watch_experts(L, y, "the output", NULL, NULL));
    st = local ? MOE_OK : moe_combine_rows(ep, &L->plan, b->y, row_nbytes, b->staging, L->buf.y);
    snprintf(what, sizeof what, "the %s combine", pass);
    return st == MOE_OK ? MOE_OK : exchange_failed(L, what, st, 1);
}

moe_status moe_layer_forward(moe_layer *L, const moe_layer_weights *w, const moe_real *x, int num_tokens,
                             moe_real *out, moe_layer_stats *stats) {
    if (!L || !w || !x || !out || num_tokens < 1) return MOE_ERR_INVALID_ARG;
    if (!weights_whole(w))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_layer_forward: the weights' router_w, w1, w3 and w2 must all be set");
    L->has_forward = 0;
    MOE_TRY(reserve_tokens(L, num_tokens));
    MOE_TRY(point_token_buffers(L, num_tokens));
    const moe_config *c = &L->cfg;
    const int T = num_tokens, d = c->d_model;
    const moe_layer_ops *steps = L->steps;
    moe_layer_state *s = L->state;
    MOE_TRY(moe_runtime_copy(L->rt, L->buf.x, x, (size_t)T * d * sizeof(moe_real))); /* for backward */
    MOE_TRY(route(L, w, T));
    MOE_TRY(permute_to_send(L));
    MOE_TRY(plan_exchange(L));
    MOE_TRY(run_experts(L, w, "forward"));
    MOE_TRY(steps->combine(s, L->buf.y, L->tok.slot, L->tok.gate, T, out));
    MOE_TRY(watch(L, out, (size_t)T * d, 0, "the combined output"));

    MOE_TRY(queue_router_losses(L));
    L->has_forward = 1;
    L->rebuilt = keeps_rows(L);
    if (stats) {
        stats->num_assignments = T * c->top_k;
        stats->num_dropped = L->counts.total_dropped;
        stats->capacity = L->counts.capacity;
        stats->num_tokens_per_expert = L->counts.num_tokens_per_expert;
        stats->num_selected_per_expert = L->counts.num_selected_per_expert;
        stats->num_tokens_global = L->counts.num_tokens_global;
        stats->num_rows_received = L->plan.num_recv;
    }
    if (L->defer_finish) return MOE_OK;
    MOE_TRY(moe_runtime_synchronize(L->rt)); /* the router losses' and the layout counts' one wait */
    return moe_layer_finish_forward(L, stats);
}

/* drouter_w += dlogits^T x: one product over the rank's tokens, or with shards one per local shard, added in the
 * shard tree. */
static moe_status router_weight_grad(moe_layer *L, int T, moe_real *drouter_w) {
    if (!L->cfg.num_shards) return L->steps->router_weight_grad(L->state, L->buf.x, 0, T, drouter_w);
    MOE_TRY(moe_shard_tree_begin(&L->router_tree, (size_t)L->cfg.num_experts * L->cfg.d_model));
    for (int j = 0; j < L->local_shards; j++) {
        moe_real *leaf;
        const int first = shard_begin(L, j, T);
        MOE_TRY(moe_shard_tree_leaf(&L->router_tree, &leaf));
        MOE_TRY(L->steps->router_weight_grad(L->state, L->buf.x, first, shard_begin(L, j + 1, T) - first, leaf));
        MOE_TRY(moe_shard_tree_push(&L->router_tree));
    }
    return moe_shard_tree_add_to(&L->router_tree, drouter_w);
}

moe_status moe_layer_recompute(moe_layer *L, const moe_layer_weights *w, const moe_real *x) {
    if (!L || !w || !x) return MOE_ERR_INVALID_ARG;
    if (!L->has_forward) return MOE_ERR_NO_FORWARD;
    const int T = L->counts.num_tokens;
    MOE_TRY(point_token_buffers(L, T));
    MOE_TRY(moe_runtime_copy(L->rt, L->buf.x, x, (size_t)T * L->cfg.d_model * sizeof(moe_real)));
    MOE_TRY(permute_to_send(L));
    MOE_TRY(run_experts(L, w, "recomputed"));
    L->rebuilt = 1;
    return MOE_OK;
}

moe_status moe_layer_backward(moe_layer *L, const moe_layer_weights *w, const moe_real *dout, moe_real *dx,
                              moe_layer_weights *grads) {
    if (!L || !w || !dout || !grads) return MOE_ERR_INVALID_ARG;
    if (!weights_whole(w) || !weights_whole(grads))
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_layer_backward: the weights' and the gradients' router_w, w1, w3 and w2 "
                        "must all be set");
    if (!L->has_forward) return MOE_ERR_NO_FORWARD;
    if (!L->rebuilt)
        return moe_fail(MOE_ERR_NO_FORWARD, "layer %d: under recompute full, backward needs moe_layer_recompute first",
                        L->cfg.layer_index);
    const int T = L->counts.num_tokens;
    const size_t row_nbytes = (size_t)L->cfg.d_model * L->steps->row_elem;
    const moe_layer_ops *steps = L->steps;
    moe_layer_state *s = L->state;
    const moe_token_routing *r = &L->tok;
    token_buffers *t = &L->buf;
    row_buffers *b = &L->rows;
    moe_comm *ep = moe_parallel_ep(L->par);
    moe_real *dgate = L->kept.dgate;
    MOE_TRY(point_token_buffers(L, T));
    MOE_TRY(point_row_buffers(L, L->plan.num_recv));

    /* Experts: dL/dy and dL/dgate here, dL/dy travels to the experts, dL/dx of their rows travels back. */
    const int local = exchange_is_local(L);
    MOE_TRY(steps->combine_backward(s, dout, t->y, r->slot, r->gate, T, local ? b->dy : t->dy, dgate));
    moe_status st = local ? MOE_OK : moe_dispatch_rows(ep, &L->plan, t->dy, row_nbytes, b->staging, b->dy);
    if (st != MOE_OK) return exchange_failed(L, "the backward dispatch", st, 1);
    if (L->cfg.recompute == MOE_RECOMPUTE_MOE) /* the SwiGLU intermediates, from the rows kept (full: already) */
        MOE_TRY(steps->experts_forward(s, w, L->plan.expert_offset, L->plan.num_recv, b->x, NULL));
    MOE_TRY(steps->experts_backward(s, w, grads, L->plan.segment_start, L->plan.ep_size * L->local_shards,
                                    L->plan.num_recv, b->x, b->dy, local ? t->dxp : b->dx));
    st = local ? MOE_OK : moe_combine_rows(ep, &L->plan, b->dx, row_nbytes, b->staging, t->dxp);
    if (st != MOE_OK) return exchange_failed(L, "the backward combine", st, 1);

    /* dx = (unpermute of dxp with unit gates) + dlogits Wr, the router's part added by router_backward */
    if (dx) MOE_TRY(steps->combine(s, t->dxp, r->slot, NULL, T, dx));
    MOE_TRY(steps->router_backward(s, w, r, T, t->x, dgate, L->counts.num_tokens_global, dx));
    MOE_TRY(router_weight_grad(L, T, grads->router_w));
    MOE_TRY(watch(L, grads->router_w, (size_t)L->cfg.num_experts * L->cfg.d_model, 0, "the router weight gradient"));
    L->completed_steps++;
    L->rebuilt = keeps_rows(L);
    return MOE_OK;
}

moe_status moe_layer_reduce_gradients(moe_layer *L, moe_layer_weights *grads) {
    if (!L || !grads) return MOE_ERR_INVALID_ARG;
    const moe_config *c = &L->cfg;
    size_t router_count = (size_t)c->num_experts * c->d_model;
    size_t expert_count = 3 * (size_t)L->num_local_experts * c->d_ff * c->d_model;
    /* the views of moe_layer_weights_view: w1, w3, w2 are one region after the router */
    if (grads->w3 != grads->w1 + expert_count / 3 || grads->w2 != grads->w3 + expert_count / 3)
        return MOE_ERR_INVALID_ARG;
    moe_status (*allreduce)(moe_comm *, moe_real *, size_t) =
        c->num_shards ? moe_comm_allreduce_tree_real : moe_comm_allreduce_sum_real;
    moe_status st = allreduce(moe_parallel_stage(L->par), grads->router_w, router_count);
    if (st == MOE_OK) st = allreduce(moe_parallel_expert_dp(L->par), grads->w1, expert_count);
    return exchange_failed(L, "the gradient all-reduce", st, 0);
}

moe_real *moe_layer_expert_bias(moe_layer *L) { return L ? L->expert_bias : NULL; }

moe_status moe_layer_share_expert_bias(moe_layer *L, moe_layer *owner) {
    if (!L || !owner || owner->cfg.num_experts != L->cfg.num_experts) return MOE_ERR_INVALID_ARG;
    /* already one bias (L itself, or an owner that selects with L's own): nothing to drop, where freeing L's own
     * left both on freed memory (a probe: a layer shared with itself) */
    if (owner->expert_bias == L->expert_bias) return MOE_OK;
    free(L->own_bias);
    L->own_bias = NULL;
    L->expert_bias = owner->expert_bias;
    return MOE_OK;
}

moe_status moe_layer_force_routing(moe_layer *L, const int *experts) {
    if (!L) return MOE_ERR_INVALID_ARG;
    L->forced_experts = experts;
    return MOE_OK;
}

moe_status moe_layer_gather_routing(moe_layer *L, int *experts, int *num_tokens_global) {
    if (!L || !experts || !num_tokens_global) return MOE_ERR_INVALID_ARG;
    if (!L->has_forward) return MOE_ERR_NO_FORWARD;
    moe_comm *stage = moe_parallel_stage(L->par);
    const int W = moe_comm_size(stage), k = L->cfg.top_k, mine = L->counts.num_tokens;
    int *tokens_of = malloc((size_t)W * sizeof(int));
    size_t *nbytes = malloc((size_t)W * sizeof(size_t));
    moe_status st = tokens_of && nbytes ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < W && st == MOE_OK; p++) nbytes[p] = sizeof(int);
    if (st == MOE_OK) st = moe_comm_allgatherv_bytes(stage, &mine, sizeof(int), tokens_of, nbytes);
    for (int p = 0; p < W && st == MOE_OK; p++) nbytes[p] = (size_t)tokens_of[p] * k * sizeof(int);
    if (st == MOE_OK)
        st = moe_comm_allgatherv_bytes(stage, L->host.expert, (size_t)mine * k * sizeof(int), experts, nbytes);
    *num_tokens_global = L->counts.num_tokens_global;
    free(tokens_of), free(nbytes);
    return exchange_failed(L, "the routing gather", st, 0);
}

/* b_e += rate * sign(mean - n_e) for global counts n (every rank the same); mean = sum / E, the tokens times k */
static void move_bias(moe_layer *L, int e, double n, double mean) {
    L->expert_bias[e] += L->cfg.bias_update_rate * (moe_real)((n < mean) - (n > mean));
}

moe_status moe_layer_update_expert_bias(moe_layer *L) {
    if (!L) return MOE_ERR_INVALID_ARG;
    if (L->cfg.score_func != MOE_SCORE_SIGMOID) return MOE_ERR_INVALID_CONFIG;
    if (!L->has_forward) return MOE_ERR_NO_FORWARD;
    const int E = L->cfg.num_experts;
    const double mean = (double)L->counts.num_tokens_global * L->cfg.top_k / E;
    for (int e = 0; e < E; e++) move_bias(L, e, L->counts.num_selected_per_expert[e], mean);
    return MOE_OK;
}

moe_status moe_layer_update_expert_bias_counts(moe_layer *L, const double *num_selected) {
    if (!L || !num_selected) return MOE_ERR_INVALID_ARG;
    if (L->cfg.score_func != MOE_SCORE_SIGMOID) return MOE_ERR_INVALID_CONFIG;
    const int E = L->cfg.num_experts;
    double sum = 0; /* whole numbers: exact in any order */
    for (int e = 0; e < E; e++) sum += num_selected[e];
    for (int e = 0; e < E; e++) move_bias(L, e, num_selected[e], sum / E);
    return MOE_OK;
}

const moe_token_routing *moe__layer_token_routing(const moe_layer *L) { return L && L->has_forward ? &L->tok : NULL; }
const moe_layer_ops *moe__layer_steps(const moe_layer *L) { return L->steps; }
void moe__layer_set_steps(moe_layer *L, const moe_layer_ops *steps) { L->steps = steps; }
