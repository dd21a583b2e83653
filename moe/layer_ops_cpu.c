/* layer_ops_cpu.c — the CPU table of the layer's steps (moe/layer_ops.h): host memory, OpenBLAS through the
 * row-wise GEMMs of kernels/gemm_rows.h, the _cpu ops of router/, kernels/ and experts/. No host syncs. */
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "core/real.h"
#include "core/threads.h"
#include "experts/expert_ffn.h"
#include "kernels/gemm_rows.h"
#include "kernels/nonfinite.h"
#include "kernels/permute.h"
#include "moe/layer_ops.h"
#include "moe/runtime.h"
#include "router/aux_loss.h"
#include "router/gates.h"
#include "router/group.h"
#include "router/layout.h"
#include "router/scores.h"
#include "router/topk.h"

struct moe_layer_state {
    moe_config cfg;
    moe_runtime *rt;
    int num_local_experts;
    moe_gemm_rows_plan router_gemm, expert_gemm; /* how row-wise GEMMs are cut into calls (cfg.layout_invariant)
                                                  * and whether they take bf16 inputs (core/precision.h) */
    int *expert_offset;          /* [E + 1] the layout's offsets (scratch) */
    int *num_selected;           /* [E] global top-k counts of the last forward, for the balance loss's gradient */
    int max_rows;                /* what the kept expert activations hold */
    moe_real *h1, *h3, *act;     /* [rows, d_ff] kept from forward for backward (the state's, or slots: expert_acts) */
    moe_real *dh1, *dh3;         /* [rows, d_ff] backward scratch (slots) */
    int max_tokens;
    moe_real *dscores, *dlogits; /* [T, E] router backward scratch */
    int nonfinite;               /* the last route's logits held a NaN or an Inf */
};

static void cpu_destroy(moe_layer_state *s) {
    if (!s) return;
    moe_gemm_rows_plan_free(&s->router_gemm), moe_gemm_rows_plan_free(&s->expert_gemm);
    free(s->expert_offset), free(s->num_selected);
    if (moe_layer_keeps_expert_acts(&s->cfg))
        moe_runtime_free(s->rt, s->h1), moe_runtime_free(s->rt, s->h3), moe_runtime_free(s->rt, s->act);
    void **bufs[] = {(void **)&s->dscores, (void **)&s->dlogits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) moe_runtime_free(s->rt, *bufs[i]);
    free(s);
}

/* The experts' staged GEMM inputs in the runtime's slots: one set for every layer (their products run one after
 * another, each staging what it reads just before). */
_Static_assert(MOE_SCRATCH_EXPERT_STAGE_END - MOE_SCRATCH_EXPERT_STAGE + 1 == MOE_GEMM_STAGE_SLOTS,
               "a runtime slot per stage slot");
static moe_status expert_stage(void *ctx, int slot, size_t nbytes, void **buffer) {
    return moe_runtime_scratch(ctx, (moe_scratch_slot)(MOE_SCRATCH_EXPERT_STAGE + slot), nbytes, buffer);
}

static moe_status cpu_create(const moe_config *cfg, int num_local_experts, moe_runtime *rt,
                          moe_layer_state **out) {
    moe_layer_state *s = calloc(1, sizeof *s);
    if (!s) return MOE_ERR_OUT_OF_MEMORY;
    s->cfg = *cfg;
    s->rt = rt;
    s->num_local_experts = num_local_experts;
    int widest = cfg->d_model > cfg->d_ff ? cfg->d_model : cfg->d_ff;
    widest = widest > cfg->num_experts ? widest : cfg->num_experts;
    s->expert_offset = calloc((size_t)cfg->num_experts + 1, sizeof(int));
    s->num_selected = calloc((size_t)cfg->num_experts, sizeof(int));
    const int bf16 = moe_precision_bf16_inputs(cfg->precision, MOE_GEMM_EXPERTS);
    moe_status st = s->expert_offset && s->num_selected
                        ? moe_gemm_rows_plan_init(&s->router_gemm, cfg->layout_invariant,
                                                  moe_precision_bf16_inputs(cfg->precision, MOE_GEMM_ROUTER), widest)
                        : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = moe_gemm_rows_plan_init(&s->expert_gemm, cfg->layout_invariant, bf16, widest);
    s->expert_gemm.stage_source = (moe_gemm_stage_source){expert_stage, rt};
    if (st != MOE_OK) return cpu_destroy(s), st;
    *out = s;
    return MOE_OK;
}

static moe_status cpu_route(moe_layer_state *s, const moe_layer_weights *w, const moe_real *x, const moe_real *bias,
                            int use_given_experts, const moe_token_routing *r, int T) {
    const moe_config *c = &s->cfg;
    const int E = c->num_experts, k = c->top_k;
    moe_status st = moe_router_logits_cpu(&s->router_gemm, x, w->router_w, T, c->d_model, E, r->logits);
    s->nonfinite = st == MOE_ERR_NONFINITE;
    if (s->nonfinite) { /* placeholders: experts 0..k-1, so that the collective steps stay well defined */
        for (int a = 0; a < T * k; a++) r->expert[a] = a % k;
        return MOE_OK;
    }
    MOE_TRY(st);
    moe_router_scores_cpu(c->score_func, r->logits, T, E, r->scores);
    const moe_real *select = r->scores;
    if (c->score_func == MOE_SCORE_SIGMOID) {
        for (size_t i = 0; i < (size_t)T * E; i++) r->select_scores[i] = r->scores[i] + bias[i % E];
        select = r->select_scores;
    }
    if (moe_config_grouped(c)) { /* only the token's best groups' experts (router/group.h) */
        moe_router_group_mask_cpu(select, T, E, c->num_groups, c->topk_groups, c->group_score,
                                  r->select_scores);
        select = r->select_scores;
    }
    if (!use_given_experts) moe_router_topk_cpu(select, T, E, k, r->expert);
    moe_router_gates_cpu(r->scores, r->expert, T, E, k, c->renormalize, moe_config_gate_scale(c), r->expert_score,
                         r->gate);
    return MOE_OK;
}

static moe_status cpu_choices_to_host(moe_layer_state *s, const moe_token_routing *r, int T, int with_scores,
                                      int *expert, moe_real *expert_score, int *nonfinite) {
    const size_t A = (size_t)T * s->cfg.top_k;
    memcpy(expert, r->expert, A * sizeof(int));
    if (with_scores) memcpy(expert_score, r->expert_score, A * sizeof(moe_real));
    if (with_scores && s->nonfinite) memset(expert_score, 0, A * sizeof(moe_real));
    *nonfinite = s->nonfinite;
    return MOE_OK;
}

static moe_status cpu_kept_to_device(moe_layer_state *s, const unsigned char *kept, const moe_token_routing *r,
                                     int T) {
    memcpy(r->kept, kept, (size_t)T * s->cfg.top_k);
    return MOE_OK;
}

static moe_status cpu_dispatch_layout(moe_layer_state *s, const moe_token_routing *r, int T, int *layout_counts) {
    moe_router_dispatch_layout_cpu(r->expert, r->kept, T, s->cfg.num_experts, s->cfg.top_k, r->slot, r->perm_token,
                                   layout_counts, s->expert_offset);
    return MOE_OK;
}

static moe_status cpu_permute(moe_layer_state *s, const moe_real *x, const int *perm_token, int num_rows, void *xp) {
    moe_permute_rows_cpu(x, perm_token, num_rows, s->cfg.d_model, xp);
    return MOE_OK;
}

static moe_status cpu_combine(moe_layer_state *s, const void *y, const int *slot, const moe_real *gate, int T,
                              moe_real *out) {
    moe_combine_rows_cpu(y, slot, gate, T, s->cfg.top_k, s->cfg.d_model, out);
    return MOE_OK;
}

static moe_status cpu_combine_backward(moe_layer_state *s, const moe_real *dout, const void *y, const int *slot,
                                       const moe_real *gate, int T, void *dy, moe_real *dgate) {
    moe_combine_rows_backward_cpu(dout, y, slot, gate, T, s->cfg.top_k, s->cfg.d_model, dy, dgate);
    return MOE_OK;
}

/* h1, h3, act for `rows` rows: the state's own, grown by a forward (grow 1), or the runtime's slots. */
static moe_status expert_acts(moe_layer_state *s, int rows, int grow) {
    const size_t n = (size_t)rows * s->cfg.d_ff * sizeof(moe_real);
    void **acts[] = {(void **)&s->h1, (void **)&s->h3, (void **)&s->act};
    if (!moe_layer_keeps_expert_acts(&s->cfg)) {
        const moe_scratch_slot slots[] = {MOE_SCRATCH_KEEP_H_A, MOE_SCRATCH_KEEP_H_B, MOE_SCRATCH_KEEP_H_C};
        for (int i = 0; i < 3; i++) MOE_TRY(moe_runtime_scratch(s->rt, slots[i], n, acts[i]));
        return MOE_OK;
    }
    if (rows <= s->max_rows) return MOE_OK;
    if (!grow) return MOE_ERR_NO_FORWARD;
    const size_t nbytes[] = {n, n, n};
    s->max_rows = 0;
    MOE_TRY(moe_runtime_regrow(s->rt, acts, nbytes, 3));
    s->max_rows = rows;
    return MOE_OK;
}

static moe_status cpu_experts_forward(moe_layer_state *s, const moe_layer_weights *w, const int *expert_offset,
                                      int rows, const void *xp, void *y) {
    MOE_TRY(expert_acts(s, rows, 1));
    /* bf16: the weights' prepared copies are kept while w->version stays the same (kernels/gemm_rows.h) */
    moe_gemm_rows_plan_set_weights_version(&s->expert_gemm, w->version);
    return moe_expert_ffn_forward_cpu(w, s->num_local_experts, s->cfg.d_model,
                                      s->cfg.d_ff, expert_offset, xp, s->h1, s->h3, s->act, y, &s->expert_gemm);
}

static moe_status cpu_experts_backward(moe_layer_state *s, const moe_layer_weights *w, moe_layer_weights *grads,
                                       const int *segment_start, int segments, int rows, const void *xp,
                                       const void *dy, void *dxp) {
    MOE_TRY(expert_acts(s, rows, 0));
    const size_t n = (size_t)rows * s->cfg.d_ff * sizeof(moe_real);
    MOE_TRY(moe_runtime_scratch(s->rt, MOE_SCRATCH_EXPERT_DH_A, n, (void **)&s->dh1));
    MOE_TRY(moe_runtime_scratch(s->rt, MOE_SCRATCH_EXPERT_DH_B, n, (void **)&s->dh3));
    void *wgrad_scratch; /* one for every layer of the runtime: their backward runs one at a time */
    MOE_TRY(moe_runtime_scratch(s->rt, MOE_SCRATCH_EXPERT_WGRAD,
                                moe_expert_ffn_wgrad_scratch_count(s->cfg.d_model, s->cfg.d_ff, segments) *
                                    sizeof(moe_real), &wgrad_scratch));
    moe_gemm_rows_plan_set_weights_version(&s->expert_gemm, w->version);
    return moe_expert_ffn_backward_cpu(w, grads, s->num_local_experts,
                                       s->cfg.d_model, s->cfg.d_ff, segment_start, segments, xp, s->h1, s->h3, s->act,
                                       dy, s->dh1, s->dh3, dxp, wgrad_scratch, &s->expert_gemm);
}

static moe_status cpu_reserve_rows(moe_layer_state *s, int rows, int expert_rows) {
    MOE_TRY(expert_acts(s, rows, 1));
    const size_t n = (size_t)rows * s->cfg.d_ff * sizeof(moe_real);
    MOE_TRY(moe_runtime_scratch(s->rt, MOE_SCRATCH_EXPERT_DH_A, n, (void **)&s->dh1));
    MOE_TRY(moe_runtime_scratch(s->rt, MOE_SCRATCH_EXPERT_DH_B, n, (void **)&s->dh3));
    return moe_expert_ffn_reserve_cpu(&s->expert_gemm, s->cfg.d_model, s->cfg.d_ff, expert_rows);
}

static moe_status cpu_find_nonfinite(moe_layer_state *s, const void *data, size_t count, int rows, long long *first) {
    (void)s, (void)rows; /* rows are moe_real on the CPU */
    *first = moe_find_nonfinite_cpu(data, count);
    return MOE_OK;
}

static moe_status cpu_router_losses(moe_layer_state *s, const moe_token_routing *r, int T, const int *num_selected,
                                    int num_tokens_global, double loss[2]) {
    const moe_config *c = &s->cfg;
    memcpy(s->num_selected, num_selected, (size_t)c->num_experts * sizeof(int));
    loss[0] = moe_router_load_balance_loss_cpu(c->score_func, r->scores, num_selected, T, num_tokens_global,
                                               c->num_experts, c->top_k);
    loss[1] = moe_router_z_loss_cpu(r->logits, T, num_tokens_global, c->num_experts);
    return MOE_OK;
}

static moe_status cpu_router_backward(moe_layer_state *s, const moe_layer_weights *w, const moe_token_routing *r,
                                      int T, const moe_real *x, const moe_real *dgate, int num_tokens_global,
                                      moe_real *dx) {
    const moe_config *c = &s->cfg;
    const int Tg = num_tokens_global, d = c->d_model, E = c->num_experts, k = c->top_k;
    (void)x; /* router_weight_grad's */
    if (T > s->max_tokens) {
        void **bufs[] = {(void **)&s->dscores, (void **)&s->dlogits};
        const size_t n = (size_t)T * E * sizeof(moe_real), nbytes[] = {n, n};
        s->max_tokens = 0;
        MOE_TRY(moe_runtime_regrow(s->rt, bufs, nbytes, 2));
        s->max_tokens = T;
    }
    /* gates and the balance loss give dL/dscores; scores and the z-loss give dL/dlogits */
    memset(s->dscores, 0, (size_t)T * E * sizeof(moe_real));
    moe_router_gates_backward_cpu(r->scores, r->expert, dgate, T, E, k, c->renormalize, moe_config_gate_scale(c),
                                  s->dscores);
    moe_router_load_balance_loss_backward_cpu(c->score_func, r->scores, s->num_selected, T, Tg, E, k, c->aux_loss_coef,
                                              s->dscores);
    moe_router_scores_backward_cpu(c->score_func, r->scores, s->dscores, T, E, s->dlogits);
    moe_router_z_loss_backward_cpu(r->logits, T, Tg, E, c->z_loss_coef, s->dlogits);
    if (dx) moe_gemm_rows_cpu(&s->router_gemm, CblasNoTrans, T, d, E, s->dlogits, w->router_w, 1, dx);
    return MOE_OK;
}

static moe_status cpu_router_weight_grad(moe_layer_state *s, const moe_real *x, int first, int T, moe_real *dW) {
    const int d = s->cfg.d_model, E = s->cfg.num_experts;
    /* dWr += dlogits^T x over the tokens given (the layer sums shards, and ranks, beyond) */
    return T > 0 ? moe_gemm_rows_at_b_cpu(&s->router_gemm, T, E, d, s->dlogits + (size_t)first * E,
                                          x + (size_t)first * d, 1, dW)
                 : MOE_OK;
}

static moe_status cpu_add(moe_layer_state *s, const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    (void)s;
    MOE__PARALLEL_FOR(n >= MOE__PAR_MIN_ELEMS,
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i]);
    return MOE_OK;
}

const moe_layer_ops moe_layer_ops_cpu = {
    .name = "cpu",
    .row_elem = sizeof(moe_real),
    .create = cpu_create,
    .destroy = cpu_destroy,
    .route = cpu_route,
    .choices_to_host = cpu_choices_to_host,
    .kept_to_device = cpu_kept_to_device,
    .dispatch_layout = cpu_dispatch_layout,
    .permute = cpu_permute,
    .combine = cpu_combine,
    .combine_backward = cpu_combine_backward,
    .experts_forward = cpu_experts_forward,
    .experts_backward = cpu_experts_backward,
    .find_nonfinite = cpu_find_nonfinite,
    .reserve_rows = cpu_reserve_rows,
    .router_losses = cpu_router_losses,
    .router_backward = cpu_router_backward,
    .router_weight_grad = cpu_router_weight_grad,
    .add = cpu_add,
};
