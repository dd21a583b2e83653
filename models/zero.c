/* zero.c — the ZeRO ranges and the norm's atoms of a rank's parameter buffer (zero.h). */
#include "models/zero.h"

#include <stdlib.h>

static size_t atom_values = MOE_ZERO_ATOM;
void moe__zero_set_atom_values(size_t n) { atom_values = n ? n : MOE_ZERO_ATOM; }
size_t moe_zero_atom_values(void) { return atom_values; }

/* Appends to b (capacity enough) the atom starts of [at, at + n) inside its region, 0 excepted. */
static void cut(size_t *b, size_t *nb, size_t at, size_t n) {
    for (size_t k = 0; k < n; k += atom_values)
        if (at + k > 0) b[(*nb)++] = at + k;
}

/* The region [base, base + count) of the buffer: its atoms' inner boundaries, from the tensors inside it. */
static moe_status init_region(moe_zero_region *r, int level, const moe_model_tensor *t, int num_tensors, size_t base,
                              size_t count, moe_comm *group) {
    size_t cap = 0, nb = 0;
    for (int i = 0; i < num_tensors; i++)
        if (t[i].offset >= base && t[i].offset < base + count)
            cap += (size_t)(t[i].experts > 1 ? t[i].experts : 1) * (t[i].count / atom_values + 1);
    size_t *bounds = malloc((cap ? cap : 1) * sizeof(size_t));
    if (!bounds) return MOE_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < num_tensors; i++) {
        if (t[i].offset < base || t[i].offset >= base + count) continue;
        const size_t slices = t[i].experts > 1 ? (size_t)t[i].experts : 1, per = t[i].count / slices;
        for (size_t e = 0; e < slices; e++) cut(bounds, &nb, t[i].offset - base + e * per, per);
    }
    *r = (moe_zero_region){group, {count, bounds, nb}, 0, count};
    if (level > 0) moe_tree_partition_range(&r->part, moe_comm_size(group), moe_comm_rank(group), &r->begin, &r->end);
    return MOE_OK;
}

moe_status moe_zero_layout_init(moe_zero_layout *z, int level, const moe_model_tensor *tensors, int num_tensors,
                                size_t num_dense, size_t num_expert, moe_comm *world, moe_comm *expert_dp) {
    *z = (moe_zero_layout){.level = level};
    moe_status st = init_region(&z->dense, level, tensors, num_tensors, 0, num_dense, world);
    if (st == MOE_OK) st = init_region(&z->expert, level, tensors, num_tensors, num_dense, num_expert, expert_dp);
    if (st != MOE_OK) moe_zero_layout_free(z);
    return st;
}

void moe_zero_layout_free(moe_zero_layout *z) {
    free((size_t *)z->dense.part.bounds), free((size_t *)z->expert.part.bounds);
    *z = (moe_zero_layout){0};
}

void moe_zero_member_range(const moe_zero_layout *z, const moe_zero_region *r, int member, size_t *lo, size_t *hi) {
    if (z->level == 0) {
        *lo = 0, *hi = r->part.count;
        return;
    }
    moe_tree_partition_range(&r->part, moe_comm_size(r->group), member, lo, hi);
}
