/* aux_loss_cpu.c — load-balancing loss and router z-loss, forward and backward (formulas in aux_loss.h). */
#include "router/aux_loss.h"

#include "core/real.h"
#include "core/threads.h"

/* Sum of a token's scores: the normaliser of q for sigmoid routing; softmax rows already sum to 1. */
static moe_real score_normaliser(moe_score_func func, const moe_real *s, int num_experts) {
    if (func == MOE_SCORE_SOFTMAX) return 1;
    moe_real sum = 0;
    for (int e = 0; e < num_experts; e++) sum += s[e];
    return sum;
}

double moe_router_load_balance_loss_cpu(moe_score_func func, const moe_real *scores, const int *num_selected,
                                        int num_tokens, int num_tokens_global, int num_experts, int top_k) {
    double loss = 0;
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *s = scores + (size_t)t * num_experts;
        moe_real norm = score_normaliser(func, s, num_experts);
        for (int e = 0; e < num_experts; e++) loss += (double)num_selected[e] * (s[e] / norm);
    }
    /* E * sum_e (n_e / (T k)) * (sum_t q_te / T) */
    return loss * num_experts / ((double)num_tokens_global * top_k * num_tokens_global);
}

void moe_router_load_balance_loss_backward_cpu(moe_score_func func, const moe_real *scores, const int *num_selected,
                                               int num_tokens, int num_tokens_global, int num_experts, int top_k,
                                               moe_real coef, moe_real *dscores) {
    /* dL/dq[t,e] = c_e = coef * E * f_e / T, the same for every token. */
    moe_real scale = coef * (moe_real)num_experts / ((moe_real)num_tokens_global * top_k * num_tokens_global);
    MOE__PARALLEL_FOR((size_t)num_tokens * num_experts >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *s = scores + (size_t)t * num_experts;
        moe_real *ds = dscores + (size_t)t * num_experts;
        if (func == MOE_SCORE_SOFTMAX) {
            for (int e = 0; e < num_experts; e++) ds[e] += scale * num_selected[e];
            continue;
        }
        /* q = s / S:  ds_e += (c_e - sum_i c_i q_i) / S */
        moe_real sum = score_normaliser(func, s, num_experts), dot = 0;
        for (int e = 0; e < num_experts; e++) dot += scale * num_selected[e] * s[e] / sum;
        for (int e = 0; e < num_experts; e++) ds[e] += (scale * num_selected[e] - dot) / sum;
    });
}

static moe_real logsumexp(const moe_real *l, int n) {
    moe_real max = l[0], sum = 0;
    for (int e = 1; e < n; e++) max = l[e] > max ? l[e] : max;
    for (int e = 0; e < n; e++) sum += moe__exp(l[e] - max);
    return max + moe__log(sum);
}

double moe_router_z_loss_cpu(const moe_real *logits, int num_tokens, int num_tokens_global, int num_experts) {
    double loss = 0;
    for (int t = 0; t < num_tokens; t++) {
        double lse = logsumexp(logits + (size_t)t * num_experts, num_experts);
        loss += lse * lse;
    }
    return loss / num_tokens_global;
}

void moe_router_z_loss_backward_cpu(const moe_real *logits, int num_tokens, int num_tokens_global, int num_experts,
                                    moe_real coef, moe_real *dlogits) {
    MOE__PARALLEL_FOR((size_t)num_tokens * num_experts >= MOE__PAR_MIN_ELEMS,
    for (int t = 0; t < num_tokens; t++) {
        const moe_real *l = logits + (size_t)t * num_experts;
        moe_real *dl = dlogits + (size_t)t * num_experts;
        moe_real lse = logsumexp(l, num_experts), scale = coef * 2 * lse / num_tokens_global;
        for (int e = 0; e < num_experts; e++) dl[e] += scale * moe__exp(l[e] - lse);
    });
}
