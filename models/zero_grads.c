/* zero_grads.c — ZeRO-2's layer-by-layer gradient reduction (zero_grads.h). */
#include "models/zero_grads.h"

#include <stdlib.h>
#include <string.h>

#include "core/fail.h"

static moe_zero_slice widen(moe_zero_slice s, size_t from, size_t count) {
    if (!s.count) return (moe_zero_slice){from, count};
    const size_t lo = s.from < from ? s.from : from, hi = s.from + s.count > from + count ? s.from + s.count
                                                                                        : from + count;
    return (moe_zero_slice){lo, hi - lo};
}

/* The slices of every layer and of the ends, from the table: a tensor belongs to its layer's slice of its region. */
static void find_slices(moe_zero_grads *g, const moe_model_tensor *t, int n, size_t num_dense) {
    for (int i = 0; i < n; i++) {
        const int expert = t[i].offset >= num_dense;
        const size_t from = t[i].offset - (expert ? num_dense : 0);
        moe_zero_slice *s = t[i].layer < 0                ? &g->head
                            : t[i].layer >= g->num_layers ? &g->tail
                            : expert                      ? &g->layer_expert[t[i].layer]
                                                          : &g->layer_dense[t[i].layer];
        *s = widen(*s, from, t[i].count);
    }
    g->window_count = 0;
    for (int l = 0; l < g->num_layers; l++) {
        const size_t c = g->layer_dense[l].count + g->layer_expert[l].count;
        g->window_count = c > g->window_count ? c : g->window_count;
    }
    g->ends_count = g->head.count + g->tail.count;
}

moe_status moe_zero_grads_init(moe_zero_grads *g, const moe_zero_layout *zero, moe_runtime *rt,
                               const moe_dense_ops *dense, moe_dense_state *state, const moe_model_tensor *tensors,
                               int num_tensors, int num_layers, moe_comm *tensor) {
    *g = (moe_zero_grads){.zero = zero, .rt = rt, .dense = dense, .state = state, .num_layers = num_layers,
                          .tensor = tensor, .tensors = tensors, .num_tensors = num_tensors};
    g->layer_dense = calloc((size_t)num_layers + 1, sizeof(moe_zero_slice));
    g->layer_expert = calloc((size_t)num_layers + 1, sizeof(moe_zero_slice));
    g->fresh = calloc((size_t)num_layers + 2, 1);
    if (!g->layer_dense || !g->layer_expert || !g->fresh) return moe_zero_grads_free(g), MOE_ERR_OUT_OF_MEMORY;
    find_slices(g, tensors, num_tensors, zero->dense.part.count);
    const size_t shard = (zero->dense.end - zero->dense.begin) + (zero->expert.end - zero->expert.begin);
    const size_t one = sizeof(moe_real);
    moe_status st = moe_runtime_alloc(rt, (g->window_count ? g->window_count : 1) * one, (void **)&g->window);
    if (st == MOE_OK) st = moe_runtime_alloc(rt, (g->ends_count ? g->ends_count : 1) * one, (void **)&g->ends);
    if (st == MOE_OK) st = moe_runtime_alloc(rt, (shard ? shard : 1) * one, (void **)&g->shard);
    if (st == MOE_OK) st = moe_runtime_zero(rt, g->shard, (shard ? shard : 1) * one);
    moe_zero_grads_start_step(g);
    if (st != MOE_OK) moe_zero_grads_free(g);
    return st;
}

void moe_zero_grads_free(moe_zero_grads *g) {
    if (g->rt) {
        moe_runtime_free(g->rt, g->window);
        moe_runtime_free(g->rt, g->ends);
        moe_runtime_free(g->rt, g->shard);
    }
    free(g->layer_dense), free(g->layer_expert), free(g->fresh);
    *g = (moe_zero_grads){0};
}

moe_real *moe_zero_grads_at(const moe_zero_grads *g, const moe_model_tensor *t) {
    const size_t num_dense = g->zero->dense.part.count;
    if (t->layer < 0) return g->ends + (t->offset - g->head.from);
    if (t->layer >= g->num_layers) return g->ends + g->head.count + (t->offset - g->tail.from);
    if (t->offset < num_dense) return g->window + (t->offset - g->layer_dense[t->layer].from);
    return g->window + g->layer_dense[t->layer].count + (t->offset - num_dense - g->layer_expert[t->layer].from);
}

void moe_zero_grads_start_step(moe_zero_grads *g) { memset(g->fresh, 1, (size_t)g->num_layers + 2); }

moe_real *moe_zero_grads_range(const moe_zero_grads *g, int expert) {
    return g->shard + (expert ? g->zero->dense.end - g->zero->dense.begin : 0);
}

/* Under tensor parallelism: the replicated tensors of dense slice s (held at `at`) summed over the tensor group first,
 * runs of consecutive ones at once. */
static moe_status sum_replicated(moe_zero_grads *g, moe_zero_slice s, moe_real *at) {
    size_t run_from = 0, run_end = 0; /* the run so far: [run_from, run_end) of the region */
    for (int i = 0; i <= g->num_tensors; i++) {
        const moe_model_tensor *t = i < g->num_tensors ? &g->tensors[i] : NULL;
        const int inside = t && !t->experts && t->offset >= s.from && t->offset < s.from + s.count;
        if (inside && t->split == MOE_SPLIT_NONE && (run_end == run_from || t->offset == run_end)) {
            if (run_end == run_from) run_from = t->offset;
            run_end = t->offset + t->count;
            continue;
        }
        if (run_end > run_from)
            MOE_TRY(moe_comm_allreduce_tree_real(g->tensor, at + (run_from - s.from), run_end - run_from));
        run_from = run_end = 0;
        if (inside && t->split == MOE_SPLIT_NONE) run_from = t->offset, run_end = t->offset + t->count;
    }
    return MOE_OK;
}

/* Slice s of a region, held at `at`, summed over the region's group; this rank's range of it copied (fresh: the step's
 * first sum of the slice) or added into the shard. */
static moe_status sum_into_shard(moe_zero_grads *g, int expert, moe_zero_slice s, moe_real *at, int fresh) {
    if (!s.count) return MOE_OK;
    if (!expert && g->tensor) MOE_TRY(sum_replicated(g, s, at));
    const moe_zero_region *r = expert ? &g->zero->expert : &g->zero->dense;
    MOE_TRY(moe_comm_reduce_scatter_tree_real(r->group, at, &r->part, s.from, s.count));
    const size_t lo = s.from > r->begin ? s.from : r->begin;
    const size_t hi = s.from + s.count < r->end ? s.from + s.count : r->end;
    if (hi <= lo) return MOE_OK;
    moe_real *dst = moe_zero_grads_range(g, expert) + (lo - r->begin);
    const moe_real *src = at + (lo - s.from);
    if (fresh) return moe_runtime_copy(g->rt, dst, src, (hi - lo) * sizeof(moe_real));
    return g->dense->add(g->state, dst, src, hi - lo, dst); /* the step's sum so far + this micro-batch's */
}

moe_status moe_zero_grads_begin_backward(moe_zero_grads *g) {
    return moe_runtime_zero(g->rt, g->ends, g->ends_count * sizeof(moe_real));
}

moe_status moe_zero_grads_begin_layer(moe_zero_grads *g, int layer) {
    const size_t n = g->layer_dense[layer].count + g->layer_expert[layer].count;
    return moe_runtime_zero(g->rt, g->window, n * sizeof(moe_real));
}

moe_status moe_zero_grads_end_layer(moe_zero_grads *g, int layer) {
    const int fresh = g->fresh[layer];
    g->fresh[layer] = 0;
    MOE_TRY(sum_into_shard(g, 0, g->layer_dense[layer], g->window, fresh));
    return sum_into_shard(g, 1, g->layer_expert[layer], g->window + g->layer_dense[layer].count, fresh);
}

moe_status moe_zero_grads_end_backward(moe_zero_grads *g, int head, int tail) {
    unsigned char *fresh = g->fresh + g->num_layers; /* the head's, then the tail's */
    if (head) {
        MOE_TRY(sum_into_shard(g, 0, g->head, g->ends, fresh[0]));
        fresh[0] = 0;
    }
    if (tail) {
        MOE_TRY(sum_into_shard(g, 0, g->tail, g->ends + g->head.count, fresh[1]));
        fresh[1] = 0;
    }
    return MOE_OK;
}
