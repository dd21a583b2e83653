/* zero.h — how ZeRO shards the parameter buffer's two regions over the ranks that share them, and the fixed pieces
 * ("atoms") of the gradient norm that let a sharded gradient give the norm bitwise.
 *
 * Atoms: every dense tensor, and every expert's slice of an expert tensor, cut into pieces of MOE_ZERO_ATOM values
 * from its start. An atom's sum of squares is one dense-ops call (a fixed order inside), and the norm adds the atoms'
 * sums in a fixed order (models/optimizer.c), so it is the same bits whoever computed each atom. The atoms depend on
 * the tensor table alone (an expert's slices are the same whatever ep), never on the layout.
 *
 * Ranges: a region (dense: summed over the world; experts: over the expert-data-parallel group) is partitioned over
 * its group by the fixed tree's recursive halving (alltoall/comm.h, moe_tree_partition), every split moved to an atom
 * boundary: a member's range is whole atoms, and with ZeRO-2 the range is exactly what the tree's reduce-scatter
 * leaves on the member, so the gradient it sums is the gradient it updates. ZeRO-1 uses the same ranges (resuming
 * across zero levels changes nothing). Without ZeRO a rank's range is the whole region. */
#ifndef MOE_MODELS_ZERO_H
#define MOE_MODELS_ZERO_H

#include <stddef.h>

#include "alltoall/comm.h"
#include "models/model.h"

/* The largest atom: small enough that ranges balance within 1M values of the even split (4 MB; Mixtral 8x7B's dense
 * range on 64 GPUs is 25M), large enough that the norm's per-atom calls stay few (1.6K for Mixtral 8x7B's dense
 * region plus 5.5K per GPU's experts at ep 8). */
enum { MOE_ZERO_ATOM = 1 << 20 };

typedef struct {
    moe_comm *group;          /* the ranks that sum this region's gradients                               */
    moe_tree_partition part;  /* the region's count and its atoms' inner boundaries (part.bounds, ascending) */
    size_t begin, end;        /* this rank's range: the whole region without ZeRO                            */
} moe_zero_region;

struct moe_zero_layout { /* typedef in models/model.h */
    int level;                /* 0, 1 or 2 (moe-train --zero)                                              */
    moe_zero_region dense, expert;
};

/* The layout of a rank's [dense | experts] buffer (tensors: the model's table; num_dense, num_expert: the regions'
 * values) at ZeRO level `level` over world (dense) and expert_dp (experts). MOE_ERR_OUT_OF_MEMORY. */
moe_status moe_zero_layout_init(moe_zero_layout *z, int level, const moe_model_tensor *tensors, int num_tensors,
                                size_t num_dense, size_t num_expert, moe_comm *world, moe_comm *expert_dp);
void moe_zero_layout_free(moe_zero_layout *z);

/* [*lo, *hi): the range of member `member` of r's group (the whole region without ZeRO). */
void moe_zero_member_range(const moe_zero_layout *z, const moe_zero_region *r, int member, size_t *lo, size_t *hi);

/* Tests only: atoms of at most n values from now on (0: MOE_ZERO_ATOM), so that a small model's tensors hold several
 * and ranges split them. Every rank and every model of a comparison must use the same. */
void moe__zero_set_atom_values(size_t n);
/* The atom size in force (MOE_ZERO_ATOM unless a test set another). */
size_t moe_zero_atom_values(void);

/* The atoms of region r: num_atoms = num_bounds + 1; atom i is [atom_begin(i), atom_begin(i + 1)). */
static inline size_t moe_zero_num_atoms(const moe_zero_region *r) { return r->part.num_bounds + 1; }
static inline size_t moe_zero_atom_begin(const moe_zero_region *r, size_t i) {
    return i == 0 ? 0 : i > r->part.num_bounds ? r->part.count : r->part.bounds[i - 1];
}

#endif
