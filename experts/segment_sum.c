/* segment_sum.c — the add schedule of an expert's per-segment weight-gradient products (segment_sum.h). */
#include "experts/segment_sum.h"

static int levels_of(int segments) {
    int levels = 0;
    while (levels < 31 && 1 << levels < segments) levels++;
    return levels;
}

int moe_segment_sum_scratch_buffers(int segments) { return levels_of(segments) + 2; }

int moe_segment_sum_steps(int segments, int sg, moe_segment_sum_step steps[MOE_SEGMENT_SUM_MAX_STEPS]) {
    if (segments < 1 || sg < 0 || sg > segments) return -1;
    const int tree = !(segments & (segments - 1));
    if (sg == segments) { /* the root into the gradient: grad = grad + slot L */
        if (!tree) return 0;
        steps[0] = (moe_segment_sum_step){-1, MOE_SEGMENT_SUM_GRAD, MOE_SEGMENT_SUM_GRAD,
                                          MOE_SEGMENT_SUM_SLOT(levels_of(segments))};
        return 1;
    }
    if (!tree) { /* segment order */
        steps[0] = (moe_segment_sum_step){sg, MOE_SEGMENT_SUM_SPARE, 0, 0};
        steps[1] = (moe_segment_sum_step){-1, MOE_SEGMENT_SUM_GRAD, MOE_SEGMENT_SUM_GRAD, MOE_SEGMENT_SUM_SPARE};
        return 2;
    }
    int n = 0, carry = sg & 1 ? MOE_SEGMENT_SUM_SPARE : MOE_SEGMENT_SUM_SLOT(0);
    steps[n++] = (moe_segment_sum_step){sg, carry, 0, 0};
    /* a binary increment of sg: each carry one addition, the older subtree (slot l) on the left; the sum goes to
     * slot l + 1 unless bit l + 1 is set too (then slot l, free again, holds it until the next carry reads it) */
    for (int l = 0; sg >> l & 1; l++) {
        const int y = MOE_SEGMENT_SUM_SLOT(sg >> (l + 1) & 1 ? l : l + 1);
        steps[n++] = (moe_segment_sum_step){-1, y, MOE_SEGMENT_SUM_SLOT(l), carry};
        carry = y;
    }
    return n;
}
