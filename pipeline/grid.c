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
    const int stage_ranks = world / pp;
    if (stage_ranks % tp != 0)
        return moe_fail(MOE_ERR_INVALID_CONFIG,
                        "rank grid: tp = %d does not divide the %d ranks of a stage (%d ranks / pp %d)", tp,
                        stage_ranks, world, pp);
    if (stage_ranks % ep != 0)
        return moe_fail(MOE_ERR_INVALID_CONFIG,
                        "rank grid: ep = %d does not divide the %d ranks of a stage (%d ranks / pp %d)", ep,
                        stage_ranks, world, pp);
    if (rank < 0 || rank >= world)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "rank grid: rank %d is outside 0 .. %d", rank, world - 1);
    const int stage_rank = rank % stage_ranks;
    *g = (moe_rank_grid){.world = world, .pp = pp, .tp = tp, .ep = ep, .dp = stage_ranks / tp,
                         .edp = stage_ranks / ep, .rank = rank, .pp_rank = rank / stage_ranks,
                         .stage_rank = stage_rank, .tp_rank = stage_rank % tp, .dp_rank = stage_rank / tp,
                         .ep_rank = stage_rank % ep, .edp_rank = stage_rank / ep};
    return MOE_OK;
}

int moe_rank_grid_rank_at(const moe_rank_grid *g, int pp_rank, int dp_rank, int tp_rank) {
    return pp_rank * (g->world / g->pp) + dp_rank * g->tp + tp_rank;
}

int moe_rank_grid_expert_rank_at(const moe_rank_grid *g, int pp_rank, int edp_rank, int ep_rank) {
    return pp_rank * (g->world / g->pp) + edp_rank * g->ep + ep_rank;
}

/* A group as an arithmetic progression: its first rank, the stride between members, the count. */
typedef struct {
    int first, stride, count, position;
} moe__group_span;

static int group_span(const moe_rank_grid *g, moe_rank_group kind, moe__group_span *s) {
    const int stage_ranks = g->world / g->pp, stage_first = g->pp_rank * stage_ranks;
    switch (kind) {
    case MOE_RANK_GROUP_PIPELINE:
        *s = (moe__group_span){g->stage_rank, stage_ranks, g->pp, g->pp_rank};
        return 1;
    case MOE_RANK_GROUP_STAGE:
        *s = (moe__group_span){stage_first, 1, stage_ranks, g->stage_rank};
        return 1;
    case MOE_RANK_GROUP_EP:
        *s = (moe__group_span){g->rank - g->ep_rank, 1, g->ep, g->ep_rank};
        return 1;
    case MOE_RANK_GROUP_EXPERT_DP:
        *s = (moe__group_span){stage_first + g->ep_rank, g->ep, g->edp, g->edp_rank};
        return 1;
    case MOE_RANK_GROUP_TENSOR:
        *s = (moe__group_span){g->rank - g->tp_rank, 1, g->tp, g->tp_rank};
        return 1;
    case MOE_RANK_GROUP_DATA:
        *s = (moe__group_span){stage_first + g->tp_rank, g->tp, g->dp, g->dp_rank};
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
    fprintf(f, "grid: %d ranks = pp %d x (tp %d x dp %d | ep %d x edp %d); rank %d: stage %d, tp %d, dp %d, ep %d, "
            "edp %d\n", g->world, g->pp, g->tp, g->dp, g->ep, g->edp, g->rank, g->pp_rank, g->tp_rank, g->dp_rank,
            g->ep_rank, g->edp_rank);
}
