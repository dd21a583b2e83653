/* grid.c — the rank grid's coordinates and groups (grid.h has the layout and its formulas). */
#include "pipeline/grid.h"

#include <string.h>

#include "core/fail.h"

moe_status moe_rank_grid_make(int world, int pp, int ep, int tp, int rank, moe_rank_grid *g) {
    if (!g) return moe_fail(MOE_ERR_INVALID_ARG, "rank grid: no grid to fill");
    memset(g, 0, sizeof *g);
    if (world < 1) return moe_fail(MOE_ERR_INVALID_CONFIG, "rank grid: %d ranks in the world; want 1 or more", world);
    if (pp < 1) return moe_fail(MOE_ERR_INVALID_CONFIG, "rank grid: pp = %d pipeline stages; want 1 or more", pp);
    if (ep < 1) return moe_fail(MOE_ERR_INVALID_CONFIG, "rank grid: ep = %d; want 1 or more", ep);
    if (tp < 1) return moe_fail(MOE_ERR_INVALID_CONFIG, "rank grid: tp = %d; want 1 or more", tp);
    /* divided one factor at a time, so that no product can overflow */
    if (world % pp != 0)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "rank grid: pp = %d pipeline stages do not divide the %d ranks", pp,
                        world);
    if ((world / pp) % tp != 0)
        return moe_fail(MOE_ERR_INVALID_CONFIG,
                        "rank grid: pp %d x tp %d does not divide the %d ranks (tp must divide the %d ranks of a "
                        "stage)",
                        pp, tp, world, world / pp);
    if ((world / pp / tp) % ep != 0)
        return moe_fail(MOE_ERR_INVALID_CONFIG,
                        "rank grid: ep = %d does not divide the %d ranks / (pp %d x tp %d) = %d data x expert ranks",
                        ep, world, pp, tp, world / pp / tp);
    if (rank < 0 || rank >= world)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "rank grid: rank %d is outside 0 .. %d", rank, world - 1);
    const int dp = world / pp / tp / ep;
    *g = (moe_rank_grid){.world = world, .pp = pp, .dp = dp, .ep = ep, .tp = tp, .rank = rank};
    g->tp_rank = rank % tp;
    g->ep_rank = rank / tp % ep;
    g->dp_rank = rank / tp / ep % dp;
    g->pp_rank = rank / tp / ep / dp;
    return MOE_OK;
}

int moe_rank_grid_rank_at(const moe_rank_grid *g, int pp_rank, int dp_rank, int ep_rank, int tp_rank) {
    return ((pp_rank * g->dp + dp_rank) * g->ep + ep_rank) * g->tp + tp_rank;
}

/* A group as an arithmetic progression: its first rank, the stride between members, the count. */
typedef struct {
    int first, stride, count, position;
} moe__group_span;

static int group_span(const moe_rank_grid *g, moe_rank_group kind, moe__group_span *s) {
    const int stage_ranks = g->world / g->pp;
    switch (kind) {
    case MOE_RANK_GROUP_PIPELINE:
        *s = (moe__group_span){g->rank % stage_ranks, stage_ranks, g->pp, g->pp_rank};
        return 1;
    case MOE_RANK_GROUP_STAGE:
        *s = (moe__group_span){g->pp_rank * stage_ranks, 1, stage_ranks, g->rank % stage_ranks};
        return 1;
    case MOE_RANK_GROUP_EP:
        *s = (moe__group_span){moe_rank_grid_rank_at(g, g->pp_rank, g->dp_rank, 0, g->tp_rank), g->tp, g->ep,
                               g->ep_rank};
        return 1;
    case MOE_RANK_GROUP_EXPERT_DP:
        *s = (moe__group_span){moe_rank_grid_rank_at(g, g->pp_rank, 0, g->ep_rank, g->tp_rank), g->ep * g->tp, g->dp,
                               g->dp_rank};
        return 1;
    case MOE_RANK_GROUP_TENSOR:
        *s = (moe__group_span){g->rank - g->tp_rank, 1, g->tp, g->tp_rank};
        return 1;
    default:
        return 0;
    }
}

int moe_rank_grid_group_size(const moe_rank_grid *g, moe_rank_group kind) {
    moe__group_span s;
    return group_span(g, kind, &s) ? s.count : 0;
}

int moe_rank_grid_group_rank(const moe_rank_grid *g, moe_rank_group kind) {
    moe__group_span s;
    return group_span(g, kind, &s) ? s.position : -1;
}

int moe_rank_grid_group_first(const moe_rank_grid *g, moe_rank_group kind) {
    moe__group_span s;
    return group_span(g, kind, &s) ? s.first : -1;
}

int moe_rank_grid_group(const moe_rank_grid *g, moe_rank_group kind, int *members) {
    moe__group_span s;
    if (!group_span(g, kind, &s)) return 0;
    for (int i = 0; i < s.count; i++) members[i] = s.first + i * s.stride;
    return s.count;
}

const char *moe_rank_grid_group_name(moe_rank_group kind) {
    static const char *const names[MOE_RANK_GROUP_COUNT] = {
#define MOE__RANK_GROUP_NAME(name, text) [name] = text,
        MOE_RANK_GROUP_LIST(MOE__RANK_GROUP_NAME)
#undef MOE__RANK_GROUP_NAME
    };
    return kind >= 0 && kind < MOE_RANK_GROUP_COUNT ? names[kind] : "?";
}

void moe_rank_grid_print(FILE *f, const moe_rank_grid *g) {
    fprintf(f, "grid: %d ranks = pp %d x dp %d x ep %d x tp %d; rank %d: stage %d, dp %d, ep %d, tp %d\n", g->world,
            g->pp, g->dp, g->ep, g->tp, g->rank, g->pp_rank, g->dp_rank, g->ep_rank, g->tp_rank);
}
