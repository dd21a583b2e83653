/* layer_buffers.h — the MoE layer's buffers of one pass, as one list: moe/layer.c allocates and points them from it and
 * models/plan_model.c counts them from it (the per-token routing arrays have their own list, router/routing.h; the
 * experts' SwiGLU intermediates are the expert tables', moe/layer_ops.h).
 *
 * X(name, rows, elem, slot, kept_below): a buffer of `rows` x d values of `elem` bytes each —
 *   rows        an expression in T (this rank's tokens), A (= T k, assignment rows in send order) and N (the rows
 *               this rank's experts received, expert-major);
 *   elem        `real` (sizeof(moe_real)) or `row` (the exchanged precision: moe/layer_ops.h's row_elem);
 *   slot        the runtime slot (moe/runtime.h) that holds it when one buffer serves every layer;
 *   kept_below  each layer keeps its own, from forward for backward, while cfg.recompute < kept_below (so
 *               MOE_RECOMPUTE_FULL: kept unless full recompute rebuilds it; MOE_RECOMPUTE_NONE: never kept, a pass's
 *               scratch). */
#ifndef MOE_MOE_LAYER_BUFFERS_H
#define MOE_MOE_LAYER_BUFFERS_H

#include "moe/runtime.h"

/* over this rank's tokens, in layout (send) order */
#define MOE_LAYER_TOKEN_BUFFERS(X)                                                                          \
    X(x, T, real, MOE_SCRATCH_KEEP_X, MOE_RECOMPUTE_FULL)      /* copy of the input (router weight gradient) */ \
    X(y, A, row, MOE_SCRATCH_KEEP_Y, MOE_RECOMPUTE_FULL)       /* expert outputs, back from the combine      */ \
    X(xp, A, row, MOE_SCRATCH_SEND_XP, MOE_RECOMPUTE_NONE)     /* input rows                                */ \
    X(dy, A, row, MOE_SCRATCH_SEND_DY, MOE_RECOMPUTE_NONE)     /* dL/dy                                     */ \
    X(dxp, A, row, MOE_SCRATCH_SEND_DXP, MOE_RECOMPUTE_NONE)   /* dL/dxp back from the experts              */

/* over the rows this rank's experts received */
#define MOE_LAYER_ROW_BUFFERS(X)                                                                            \
    X(x, N, row, MOE_SCRATCH_KEEP_RECV_X, MOE_RECOMPUTE_FULL)       /* expert inputs                     */ \
    X(staging, N, row, MOE_SCRATCH_RECV_STAGING, MOE_RECOMPUTE_NONE) /* the exchanges' peer-major landing */ \
    X(y, N, row, MOE_SCRATCH_RECV_Y, MOE_RECOMPUTE_NONE)            /* expert outputs                    */ \
    X(dy, N, row, MOE_SCRATCH_RECV_DY, MOE_RECOMPUTE_NONE)                                                  \
    X(dx, N, row, MOE_SCRATCH_RECV_DX, MOE_RECOMPUTE_NONE)

#endif
