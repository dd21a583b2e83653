/* grid.h — the rank grid (issues 27, 28) as data: which pipeline stage, data-parallel replica, expert shard and
 * tensor-parallel piece each world rank is, and the world ranks of each group it belongs to. One place computes
 * the layout; communicators are split from it. Pure host computation: no communication, no device, no host sync.
 *
 * Sizes: world W = pp · dp · ep · tp. Pipeline stages outermost, then the data x expert block as today (ep
 * consecutive expert shards form an EP group), then tensor parallelism innermost:
 *   rank = ((pp_rank · dp + dp_rank) · ep + ep_rank) · tp + tp_rank,   dp = W / (pp · tp · ep).
 * With pp = tp = 1 this is alltoall/parallel_mpi.c's layout: ep_rank = rank % ep, dp_rank = rank / ep.
 *
 * Groups: the world ranks whose coordinates agree on all but some, listed in ascending order, which is the
 * order of the coordinate(s) that vary (a member's position in the list is its rank inside the group).
 *   PIPELINE   same dp, ep, tp; one rank per stage, stride W / pp          size pp,     position pp_rank
 *   STAGE      every rank of this stage: ranks pp_rank·W/pp .. +W/pp - 1  size W / pp, position rank % (W/pp)
 *              (the ranks a layer's dense gradient sums run over: today's "world" of the layer)
 *   EP         same stage, dp, tp; stride tp                               size ep,     position ep_rank
 *   EXPERT_DP  same stage, ep, tp; stride ep · tp                          size dp,     position dp_rank
 *   TENSOR     same stage, dp, ep; consecutive ranks                       size tp,     position tp_rank */
#ifndef MOE_PIPELINE_GRID_H
#define MOE_PIPELINE_GRID_H

#include <stdio.h>

#include "core/types.h"

/* the group kinds, with the name moe_rank_grid_group_name gives them */
#define MOE_RANK_GROUP_LIST(X)                  \
    X(MOE_RANK_GROUP_PIPELINE, "pipeline")      \
    X(MOE_RANK_GROUP_STAGE, "stage")            \
    X(MOE_RANK_GROUP_EP, "ep")                  \
    X(MOE_RANK_GROUP_EXPERT_DP, "expert-dp")    \
    X(MOE_RANK_GROUP_TENSOR, "tensor")

typedef enum {
#define MOE__RANK_GROUP_ENUM(name, text) name,
    MOE_RANK_GROUP_LIST(MOE__RANK_GROUP_ENUM)
#undef MOE__RANK_GROUP_ENUM
    MOE_RANK_GROUP_COUNT
} moe_rank_group;

/* Read-only once made: fill it with moe_rank_grid_make. */
typedef struct {
    int world, pp, dp, ep, tp;                  /* sizes: world = pp · dp · ep · tp */
    int rank, pp_rank, dp_rank, ep_rank, tp_rank; /* this rank and its coordinates, each 0 .. size - 1 */
} moe_rank_grid;

/* The grid of `world` ranks as seen by `rank`. MOE_ERR_INVALID_CONFIG with a message for a size below 1, pp not
 * dividing the world, tp not dividing world / pp, ep not dividing world / (pp · tp), or rank outside
 * 0 .. world - 1; MOE_ERR_INVALID_ARG for g NULL. *g is zeroed on failure. */
moe_status moe_rank_grid_make(int world, int pp, int ep, int tp, int rank, moe_rank_grid *g);

/* The world rank at these coordinates of g's grid (each taken as within its size). */
int moe_rank_grid_rank_at(const moe_rank_grid *g, int pp_rank, int dp_rank, int ep_rank, int tp_rank);

/* The size of a group of this kind (0 for an unknown kind). */
int moe_rank_grid_group_size(const moe_rank_grid *g, moe_rank_group kind);

/* g's rank's position inside its group of this kind (-1 for an unknown kind). */
int moe_rank_grid_group_rank(const moe_rank_grid *g, moe_rank_group kind);

/* The lowest world rank of g's rank's group of this kind, which names the group (-1 for an unknown kind): what a
 * communicator split colours by. */
int moe_rank_grid_group_first(const moe_rank_grid *g, moe_rank_group kind);

/* Writes the world ranks of g's rank's group of this kind into members (room for moe_rank_grid_group_size),
 * ascending; returns their count (0 for an unknown kind, with nothing written). */
int moe_rank_grid_group(const moe_rank_grid *g, moe_rank_group kind, int *members);

/* "pipeline", "stage", "ep", "expert-dp", "tensor"; "?" for an unknown kind. */
const char *moe_rank_grid_group_name(moe_rank_group kind);

/* One line, for a program's start:
 * "grid: 8 ranks = pp 2 x dp 2 x ep 2 x tp 1; rank 5: stage 1, dp 0, ep 1, tp 0" */
void moe_rank_grid_print(FILE *f, const moe_rank_grid *g);

#endif
