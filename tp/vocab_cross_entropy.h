/* vocab_cross_entropy.h — the cross-entropy of a vocabulary split over the tensor-parallel group (Megatron's
 * vocabulary-parallel cross-entropy), the same bits at any tensor-parallel size. CPU (runtime host memory).
 *
 * Rank r of tp holds the logits of vocabulary columns [r V/tp, (r+1) V/tp): logits_local [T, V/tp]. Per token t:
 *   M_t     = the largest logit over the whole vocabulary (a max: exact in any order; the ranks' maxima gathered)
 *   s_t,p   = sum over piece p's columns v, in column order, of exp(l_t,v - M_t), in double; the S fixed pieces
 *             p = [p V/S, (p+1) V/S) (--tp-shards, as tp/linear.h's)
 *   Z_t     = the S piece sums added in the fixed binary tree (a rank's pieces are a whole subtree, summed locally;
 *             the upper levels across the group: moe_comm_allreduce_tree_f64)
 *   loss_t  = M_t + log Z_t - l_t,target   (l_t,target from the rank holding the column; the others add an exact 0)
 * and the loss sum over tokens in kernels/cross_entropy_cpu.c's fixed chunks. So every rank returns the same loss and
 * the bits depend on S and the logits alone; with S = 1 (tp 1) the loss and the gradient are the whole-vocabulary
 * kernel's, bit for bit (the same max, the same in-order sum, the same formulas).
 * Backward: dl_t,v = scale (exp(l_t,v - M_t) / Z_t - [v == target_t]) on this rank's columns, from the forward's M and
 * Z (kept). The per-row work is the runtime's dense table's (kernels/vocab_cross_entropy.h: the CPU's in column order
 * as above; CUDA's a fixed block order, the same bits at any tp on the GPU), the exchanges run on the host: a forward
 * downloads T maxima, T x S/tp piece sums, T target logits and T targets, and uploads T maxima and T denominators.
 * Host syncs: those transfers and the group's exchanges. */
#ifndef MOE_TP_VOCAB_CROSS_ENTROPY_H
#define MOE_TP_VOCAB_CROSS_ENTROPY_H

#include "alltoall/comm.h"
#include "moe/dense_ops.h"
#include "moe/runtime.h"

typedef struct {
    moe_runtime *rt;
    const moe_dense_ops *ops;
    moe_dense_state *dense; /* the caller's */
    moe_comm *group;        /* NULL: alone (tp 1) */
    int tp, tp_rank, num_pieces;
    int num_tokens;         /* of the last forward (what backward may take) */
    /* host */
    moe_real *max;          /* [T] M_t */
    double *z;              /* [T] Z_t */
    double *pieces;         /* [S/tp][T] this rank's piece sums */
    double *gathered;       /* [tp][T] the ranks' maxima (as double), then the target logits */
    double *token_loss;     /* [T] of the last forward */
    int *targets;           /* [T] */
    /* runtime memory: M_t and Z_t (what backward reads), the piece sums and target logits */
    moe_real *dev_max;
    double *dev_z, *dev_pieces, *dev_target;
    size_t cap;             /* tokens the buffers hold */
} moe_tp_cross_entropy;

/* num_pieces and group as moe_tp_linear_init's (MOE_ERR_INVALID_CONFIG otherwise); dense: a state of rt's dense
 * table. */
moe_status moe_tp_cross_entropy_init(moe_tp_cross_entropy *ce, moe_runtime *rt, moe_dense_state *dense,
                                     moe_comm *group, int num_pieces);
void moe_tp_cross_entropy_free(moe_tp_cross_entropy *ce);

/* *loss_sum = sum_t loss_t (the same on every rank). vocab: the whole V (S must divide it); targets (runtime memory)
 * in [0, V) on every rank. */
moe_status moe_tp_cross_entropy_forward(moe_tp_cross_entropy *ce, const moe_real *logits_local, const int *targets,
                                        int num_tokens, int vocab, double *loss_sum);
/* The loss sum of tokens [first, first + count) of the last forward, added in the fixed chunks that a forward of those
 * tokens alone uses (a token's loss does not depend on the tokens beside it): the sums of shards of a forward's tokens
 * with one forward. */
double moe_tp_cross_entropy_range_sum(const moe_tp_cross_entropy *ce, int first, int count);
/* Overwrites logits_local with scale * dL/dlogits of this rank's columns; after a forward of the same tokens. */
moe_status moe_tp_cross_entropy_backward(moe_tp_cross_entropy *ce, moe_real *logits_local, const int *targets,
                                         int num_tokens, int vocab, moe_real scale);

#endif
