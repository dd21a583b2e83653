/* grid.h — the rank grid (issues 27, 28) as data: which pipeline stage, tensor-parallel piece, data-parallel replica,
 * expert shard and expert replica each world rank is, and the world ranks of each group it belongs to. One place
 * computes the layout; communicators are split from it. Pure host computation: no communication, no device, no host
 * sync.
 *
 * Sizes: world W, pp stages of Ws = W / pp consecutive ranks. Inside a stage, two ways of reading the same ranks
 * (Megatron-Core's "MoE parallel folding"): the dense layers see tp-rank tensor groups innermost and dp = Ws / tp
 * data-parallel replicas; the MoE layers see ep-rank expert groups innermost and edp = Ws / ep expert replicas:
 *   rank = pp_rank · Ws + stage_rank,   stage_rank = dp_rank · tp + tp_rank = edp_rank · ep + ep_rank.
 * Why folded: with sequence parallelism each rank of a tensor group holds its own consecutive slice of the group's
 * tokens, so a stage's ranks hold consecutive slices of the batch in stage-rank order, and an expert group of
 * consecutive ranks holds a contiguous range of it — what the batch's fixed summation tree needs (an expert group's
 * expert gradients are a subtree, docs/DETERMINISM.md). The MoE layer then sees the layout of tp 1 over Ws ranks.
 * With tp = 1, dp = Ws; with pp = tp = 1 this is alltoall/parallel_mpi.c's layout of old: ep_rank = rank % ep,
 * edp_rank = rank / ep.
 *
 * Groups: the world ranks whose coordinates agree on all but one, listed in ascending order, which is the order of
 * the coordinate that varies (a member's position in the list is its rank inside the group).
 *   PIPELINE   same stage_rank; stride Ws                          size pp,  position pp_rank
 *   STAGE      every rank of this stage                            size Ws,  position stage_rank
 *              (the ranks over which a replicated tensor's gradient is summed: the norms, routers, embedding)
 *   EP         same stage and edp_rank: consecutive                size ep,  position ep_rank
 *   EXPERT_DP  same stage and ep_rank: stride ep                   size edp, position edp_rank
 *   TENSOR     same stage and dp_rank: consecutive                 size tp,  position tp_rank
 *   DATA       same stage and tp_rank: stride tp                   size dp,  position dp_rank
 *              (the ranks over which a tensor-parallel piece's gradient is summed) */
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
    X(MOE_RANK_GROUP_TENSOR, "tensor")          \
    X(MOE_RANK_GROUP_DATA, "data")

typedef enum {
#define MOE__RANK_GROUP_ENUM(name, text) name,
    MOE_RANK_GROUP_LIST(MOE__RANK_GROUP_ENUM)
#undef MOE__RANK_GROUP_ENUM
    MOE_RANK_GROUP_COUNT
} moe_rank_group;

/* Read-only once made: fill it with moe_rank_grid_make. */
typedef struct {
    int world, pp, tp, ep;  /* sizes                                                                  */
    int dp, edp;            /* data-parallel replicas of the dense layers (Ws / tp), of an expert (Ws / ep) */
    int rank, pp_rank, stage_rank, tp_rank, dp_rank, ep_rank, edp_rank; /* this rank, its coordinates    */
} moe_rank_grid;

/* The grid of `world` ranks as seen by `rank`. MOE_ERR_INVALID_CONFIG with a message for a size below 1, pp not
 * dividing the world, tp or ep not dividing the world / pp ranks of a stage, or rank outside 0 .. world - 1;
 * MOE_ERR_INVALID_ARG for g NULL. *g is zeroed on failure. */
moe_status moe_rank_grid_make(int world, int pp, int ep, int tp, int rank, moe_rank_grid *g);

/* The world rank of stage pp_rank's rank at dense coordinates (dp_rank, tp_rank), and at MoE coordinates (edp_rank,
 * ep_rank) (each taken as within its size). */
int moe_rank_grid_rank_at(const moe_rank_grid *g, int pp_rank, int dp_rank, int tp_rank);
int moe_rank_grid_expert_rank_at(const moe_rank_grid *g, int pp_rank, int edp_rank, int ep_rank);

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

/* "pipeline", "stage", "ep", "expert-dp", "tensor", "data"; "?" for an unknown kind. */
const char *moe_rank_grid_group_name(moe_rank_group kind);

/* One line, for a program's start:
 * "grid: 8 ranks = pp 2 x (tp 2 x dp 2 | ep 2 x edp 2); rank 5: stage 1, tp 1, dp 0, ep 1, edp 0" */
void moe_rank_grid_print(FILE *f, const moe_rank_grid *g);

#endif
