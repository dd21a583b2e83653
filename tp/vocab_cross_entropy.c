/* vocab_cross_entropy.c — the vocabulary-parallel cross-entropy (vocab_cross_entropy.h): the runtime's per-row parts
 * (kernels/vocab_cross_entropy.h; on the CPU kernels/cross_entropy_cpu.c's formulas and sums, so that S = 1 is that
 * kernel bit for bit) and the group's exchanges on the host. */
#include "tp/vocab_cross_entropy.h"

#include <math.h>
#include <stdlib.h>

#include "alltoall/tree_reduce.h"
#include "core/fail.h"
#include "core/threads.h" /* MOE__SUM_CHUNKS */
#include "tp/linear.h"

moe_status moe_tp_cross_entropy_init(moe_tp_cross_entropy *ce, moe_runtime *rt, moe_dense_state *dense,
                                     moe_comm *group, int num_pieces) {
    *ce = (moe_tp_cross_entropy){.rt = rt, .ops = moe_runtime_dense_ops(rt), .dense = dense, .group = group, .tp = 1,
                                 .num_pieces = num_pieces};
    if (group) ce->tp = moe_comm_size(group), ce->tp_rank = moe_comm_rank(group);
    return moe_tp_pieces_check(num_pieces, ce->tp);
}

void moe_tp_cross_entropy_free(moe_tp_cross_entropy *ce) {
    free(ce->max), free(ce->z), free(ce->pieces), free(ce->gathered), free(ce->token_loss), free(ce->targets);
    ce->max = NULL, ce->z = ce->pieces = ce->gathered = ce->token_loss = NULL, ce->targets = NULL;
    if (ce->rt) {
        moe_runtime_free(ce->rt, ce->dev_max), moe_runtime_free(ce->rt, ce->dev_z);
        moe_runtime_free(ce->rt, ce->dev_pieces), moe_runtime_free(ce->rt, ce->dev_target);
    }
    ce->dev_max = NULL, ce->dev_z = ce->dev_pieces = ce->dev_target = NULL, ce->cap = 0;
}

static moe_status reserve(moe_tp_cross_entropy *ce, int T) {
    if ((size_t)T <= ce->cap) return MOE_OK;
    moe_tp_cross_entropy_free(ce);
    const size_t n = (size_t)T, L = (size_t)(ce->num_pieces / ce->tp);
    ce->max = malloc(n * sizeof *ce->max), ce->z = malloc(n * sizeof *ce->z);
    ce->pieces = malloc(n * L * sizeof *ce->pieces);
    ce->gathered = malloc(n * (size_t)ce->tp * sizeof *ce->gathered);
    ce->token_loss = malloc(n * sizeof *ce->token_loss), ce->targets = malloc(n * sizeof *ce->targets);
    moe_status st = ce->max && ce->z && ce->pieces && ce->gathered && ce->token_loss && ce->targets
                        ? MOE_OK
                        : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = moe_runtime_alloc(ce->rt, n * sizeof(moe_real), (void **)&ce->dev_max);
    if (st == MOE_OK) st = moe_runtime_alloc(ce->rt, n * sizeof(double), (void **)&ce->dev_z);
    if (st == MOE_OK) st = moe_runtime_alloc(ce->rt, n * L * sizeof(double), (void **)&ce->dev_pieces);
    if (st == MOE_OK) st = moe_runtime_alloc(ce->rt, n * sizeof(double), (void **)&ce->dev_target);
    if (st != MOE_OK) {
        moe_tp_cross_entropy_free(ce);
        return moe_fail(st, "the vocabulary-parallel cross-entropy's buffers for %d tokens", T);
    }
    ce->cap = n;
    return MOE_OK;
}

static moe_status check_shape(const moe_tp_cross_entropy *ce, int T, int V) {
    if (T < 0 || V < 1 || V % ce->num_pieces)
        return moe_fail(MOE_ERR_INVALID_ARG, "a vocabulary of %d split into %d fixed pieces (--tp-shards): the pieces "
                        "must divide it", V, ce->num_pieces);
    return MOE_OK;
}

/* M_t over the whole vocabulary: this rank's row maxima, then the largest of every rank's (exact in any order), on the
 * host and in dev_max */
static moe_status global_max(moe_tp_cross_entropy *ce, const moe_real *logits, int T, int V_local) {
    const size_t nbytes = (size_t)T * sizeof(moe_real);
    MOE_TRY(ce->ops->vocab_row_max(ce->dense, logits, T, V_local, ce->dev_max));
    MOE_TRY(moe_runtime_download(ce->rt, ce->max, ce->dev_max, nbytes));
    if (ce->tp == 1) return MOE_OK;
    moe_real *all = (moe_real *)ce->gathered; /* [tp][T] */
    MOE_TRY(moe_comm_allgather_bytes(ce->group, ce->max, nbytes, all));
    for (int t = 0; t < T; t++)
        for (int r = 0; r < ce->tp; r++) ce->max[t] = all[(size_t)r * T + t] > ce->max[t] ? all[(size_t)r * T + t]
                                                                                         : ce->max[t];
    return moe_runtime_upload(ce->rt, ce->dev_max, ce->max, nbytes);
}

moe_status moe_tp_cross_entropy_forward(moe_tp_cross_entropy *ce, const moe_real *logits_local, const int *targets,
                                        int num_tokens, int vocab, double *loss_sum) {
    MOE_TRY(check_shape(ce, num_tokens, vocab));
    const int T = num_tokens, V_local = vocab / ce->tp, w = vocab / ce->num_pieces, L = ce->num_pieces / ce->tp;
    MOE_TRY(reserve(ce, T > 0 ? T : 1));
    ce->num_tokens = T;
    *loss_sum = 0;
    if (T == 0) return MOE_OK;
    MOE_TRY(moe_runtime_download(ce->rt, ce->targets, targets, (size_t)T * sizeof(int)));
    for (int t = 0; t < T; t++) /* before any exchange: every rank has the same targets and stops alike */
        if (ce->targets[t] < 0 || ce->targets[t] >= vocab)
            return moe_fail(MOE_ERR_INVALID_ARG, "token %d's target %d is outside the vocabulary of %d", t,
                            ce->targets[t], vocab);
    MOE_TRY(global_max(ce, logits_local, T, V_local));
    /* the piece sums (CPU: each in column order, in double: the whole-vocabulary kernel's sum when S = 1) and the
     * target logits, each from the rank that holds its column, exact zeros from the others */
    MOE_TRY(ce->ops->vocab_piece_sums(ce->dense, logits_local, ce->dev_max, targets, T, V_local, w,
                                      ce->tp_rank * V_local, ce->dev_pieces, ce->dev_target));
    double *target_logit = ce->gathered;
    MOE_TRY(moe_runtime_download(ce->rt, ce->pieces, ce->dev_pieces, (size_t)L * T * sizeof(double)));
    MOE_TRY(moe_runtime_download(ce->rt, target_logit, ce->dev_target, (size_t)T * sizeof(double)));
    const void *leaves[64];
    if (L > (int)(sizeof leaves / sizeof *leaves))
        return moe_fail(MOE_ERR_INVALID_CONFIG, "%d fixed pieces per rank (at most 64)", L);
    for (int j = 0; j < L; j++) leaves[j] = ce->pieces + (size_t)j * T;
    MOE_TRY(moe_tree_reduce_local(MOE_TREE_F64, leaves, L, (size_t)T, ce->z));
    if (ce->tp > 1) {
        MOE_TRY(moe_comm_allreduce_tree_f64(ce->group, ce->z, (size_t)T));
        MOE_TRY(moe_comm_allreduce_sum_f64(ce->group, target_logit, (size_t)T));
    }
    MOE_TRY(moe_runtime_upload(ce->rt, ce->dev_z, ce->z, (size_t)T * sizeof(double)));
    for (int t = 0; t < T; t++) ce->token_loss[t] = (double)ce->max[t] + log(ce->z[t]) - target_logit[t];
    *loss_sum = moe_tp_cross_entropy_range_sum(ce, 0, T);
    return MOE_OK;
}

/* the token losses in the whole-vocabulary kernel's fixed chunks */
double moe_tp_cross_entropy_range_sum(const moe_tp_cross_entropy *ce, int first, int count) {
    double part[MOE__SUM_CHUNKS], total = 0;
    const double *loss = ce->token_loss + first;
    for (int c = 0; c < MOE__SUM_CHUNKS; c++) {
        const int t0 = (int)((long long)count * c / MOE__SUM_CHUNKS);
        const int t1 = (int)((long long)count * (c + 1) / MOE__SUM_CHUNKS);
        part[c] = 0;
        for (int t = t0; t < t1; t++) part[c] += loss[t];
    }
    for (int c = 0; c < MOE__SUM_CHUNKS; c++) total += part[c];
    return total;
}

moe_status moe_tp_cross_entropy_backward(moe_tp_cross_entropy *ce, moe_real *logits_local, const int *targets,
                                         int num_tokens, int vocab, moe_real scale) {
    MOE_TRY(check_shape(ce, num_tokens, vocab));
    if (num_tokens != ce->num_tokens)
        return moe_fail(MOE_ERR_INVALID_ARG, "the vocabulary-parallel cross-entropy's backward of %d tokens after a "
                        "forward of %d", num_tokens, ce->num_tokens);
    if (num_tokens == 0) return MOE_OK;
    const int V_local = vocab / ce->tp;
    return ce->ops->vocab_backward(ce->dense, logits_local, ce->dev_max, ce->dev_z, targets, num_tokens, V_local,
                                   ce->tp_rank * V_local, scale);
}
