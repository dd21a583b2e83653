/* tree_schedule.c — the fixed order of a local tree sum, as steps (tree_schedule.h). */
#include "core/tree_schedule.h"

static int levels_of(int segments) {
    int levels = 0;
    while (levels < 31 && 1 << levels < segments) levels++;
    return levels;
}

int moe_tree_schedule_buffers(int segments) { return levels_of(segments) + 2; }

int moe_tree_schedule_steps(int segments, int sg, moe_tree_step steps[MOE_TREE_MAX_STEPS]) {
    if (segments < 1 || sg < 0 || sg > segments) return -1;
    const int tree = !(segments & (segments - 1));
    if (sg == segments) { /* the root into out: out = out + slot L */
        if (!tree) return 0;
        steps[0] = (moe_tree_step){-1, MOE_TREE_OUT, MOE_TREE_OUT,
                                          MOE_TREE_SLOT(levels_of(segments))};
        return 1;
    }
    if (!tree) { /* segment order */
        steps[0] = (moe_tree_step){sg, MOE_TREE_SPARE, 0, 0};
        steps[1] = (moe_tree_step){-1, MOE_TREE_OUT, MOE_TREE_OUT, MOE_TREE_SPARE};
        return 2;
    }
    int n = 0, carry = sg & 1 ? MOE_TREE_SPARE : MOE_TREE_SLOT(0);
    steps[n++] = (moe_tree_step){sg, carry, 0, 0};
    /* a binary increment of sg: each carry one addition, the older subtree (slot l) on the left; the sum goes to
     * slot l + 1 unless bit l + 1 is set too (then slot l, free again, holds it until the next carry reads it) */
    for (int l = 0; sg >> l & 1; l++) {
        const int y = MOE_TREE_SLOT(sg >> (l + 1) & 1 ? l : l + 1);
        steps[n++] = (moe_tree_step){-1, y, MOE_TREE_SLOT(l), carry};
        carry = y;
    }
    return n;
}
