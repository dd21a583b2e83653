/* layer_ops_cuda.c — the CUDA table of the layer's steps (moe/layer_ops.h): the _cuda ops of router/, kernels/
 * and experts/, all queued on the runtime's stream. Router and losses in fp32; expert rows, exchanges and
 * expert GEMMs in bf16 with fp32 accumulation; fp32 master weights and gradients.
 *
 * Host syncs: choices_to_host (the top-k choices, and their scores when capacity drops by score, go to the
 * host for the capacity rule, with the non-finite flag of the logits). Every other copy to or from the host uses
 * pinned memory and stays queued: the kept flags, the selection bias, the global counts, the router losses' shares
 * and the layout's counts (both read by the layer once its caller synchronises: moe_layer_finish_forward). Growing a
 * buffer (the first calls) frees the old one, which waits for the device.
 *
 * Expert GEMMs: with cfg.layout_invariant (the default) MOE_EXPERT_GEMM_ROW_BLOCKS, per expert in fixed row blocks,
 * and the router's row-wise products in the same blocks (kernels/linear.h), so that a token's values do not depend
 * on how many tokens a rank or an expert has (with MOE_LINEAR_GEMM=lt both as one pinned cuBLASLt call per expert
 * and product instead: MOE_EXPERT_GEMM_LT, kernels/gemm_lt.h); without it MOE_EXPERT_GEMM_PER_EXPERT, or with
 * MOE_EXPERT_GEMM=grouped in the environment cublasGemmGroupedBatchedEx (bench/bench_grouped_gemm compares them; docs/BENCHMARKS.md), whose
 * pointer arrays go up from pageable memory (a host sync per GEMM group). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "experts/expert_ffn.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/permute.h"
#include "moe/layer_ops.h"
#include "moe/runtime.h"
#include "router/aux_loss.h"
#include "router/gates.h"
#include "router/group.h"
#include "router/layout.h"
#include "router/scores.h"
#include "router/topk.h"

_Static_assert(sizeof(moe_real) == sizeof(float), "the CUDA table is float only");

struct moe_layer_state {
    moe_config cfg;
    moe_runtime *rt;
    moe_gpu *gpu;
    int num_local_experts;
    moe_expert_gemm_mode gemm_mode; /* ROW_BLOCKS (LT under MOE_LINEAR_GEMM=lt) with cfg.layout_invariant, else
                                       MOE_EXPERT_GEMM's choice */
    moe_linear_plan router_rows;    /* the router's row-wise products: fixed row blocks with cfg.layout_invariant, or
                                       pinned cuBLASLt calls (MOE_LINEAR_GEMM=lt) */
    moe_expert_weights_bf16 wb;  /* bf16 packs of this rank's experts, remade by a forward when the weights changed */
    unsigned long long wb_version; /* the w->version of w1 wb_w1 they were made from (0: remade at every forward) */
    const moe_real *wb_w1;
    int max_rows;
    moe_bf16 *h13, *act;         /* [rows, 2 d_ff], [rows, d_ff] kept from forward (the state's, or slots: expert_acts) */
    moe_bf16 *dh13, *dact;       /* backward scratch of the same shapes (slots) */
    int max_tokens;
    float *dscores, *dlogits;    /* [T, E] router backward scratch */
    float *bias;                 /* [E] selection bias (sigmoid routing) */
    int *num_selected;           /* [E] global top-k counts, for the balance loss and its gradient */
    int *counts, *expert_offset; /* [E], [E + 1] the layout's, on the device */
    /* pinned host staging of the queued copies */
    float *bias_host;            /* [E] */
    int *num_selected_host;      /* [E] */
    int num_selected_staged;     /* num_selected_host holds what num_selected holds (cuda_router_losses)   */
    int *nonfinite_host;         /* [1] the logits' non-finite flag, read after the routing's sync */
};

static void free_device(moe_layer_state *s, void **ptrs[], int n) {
    for (int i = 0; i < n; i++) moe_runtime_free(s->rt, *ptrs[i]), *ptrs[i] = NULL;
}

static void cuda_destroy(moe_layer_state *s) {
    if (!s) return;
    if (moe_layer_keeps_expert_acts(&s->cfg))
        moe_runtime_free(s->rt, s->h13), moe_runtime_free(s->rt, s->act);
    void **ptrs[] = {(void **)&s->wb.w13, (void **)&s->wb.w2, (void **)&s->dscores, (void **)&s->dlogits,
                     (void **)&s->bias, (void **)&s->num_selected, (void **)&s->counts, (void **)&s->expert_offset};
    free_device(s, ptrs, sizeof ptrs / sizeof *ptrs);
    moe_runtime_host_free(s->rt, s->bias_host);
    moe_runtime_host_free(s->rt, s->num_selected_host);
    moe_runtime_host_free(s->rt, s->nonfinite_host);
    moe_linear_plan_free(s->gpu, &s->router_rows);
    free(s);
}

static moe_status cuda_create(const moe_config *cfg, int num_local_experts, moe_runtime *rt,
                           moe_layer_state **out) {
    moe_gpu *gpu = moe_runtime_gpu(rt);
    if (!gpu)
        return moe_fail(MOE_ERR_NO_DEVICE, "the CUDA layer table needs a CUDA runtime, not '%s'", moe_runtime_name(rt));
    if (!moe_precision_bf16_inputs(cfg->precision, MOE_GEMM_EXPERTS) ||
        moe_precision_bf16_inputs(cfg->precision, MOE_GEMM_ROUTER))
        return moe_fail(MOE_ERR_INVALID_CONFIG, "the CUDA layer runs its experts in bf16 and its router in fp32: "
                                                "it needs precision bf16 (fp32 experts on CUDA are not written yet)");
    moe_layer_state *s = calloc(1, sizeof *s);
    if (!s) return MOE_ERR_OUT_OF_MEMORY;
    s->cfg = *cfg;
    s->rt = rt;
    s->gpu = gpu;
    s->num_local_experts = num_local_experts;
    moe_linear_gemm gemm = MOE_LINEAR_SGEMM; /* the pinned path (MOE_LINEAR_GEMM=lt) for the router and the experts */
    moe_status st = moe_linear_gemm_from_env(&gemm);
    if (st != MOE_OK) return free(s), st;
    const char *mode = getenv("MOE_EXPERT_GEMM");
    s->gemm_mode = cfg->layout_invariant ? (gemm == MOE_LINEAR_LT ? MOE_EXPERT_GEMM_LT : MOE_EXPERT_GEMM_ROW_BLOCKS)
                   : mode && !strcmp(mode, "grouped") ? MOE_EXPERT_GEMM_GROUPED
                                                      : MOE_EXPERT_GEMM_PER_EXPERT;
    size_t EL = s->num_local_experts, E = cfg->num_experts, wcount = (size_t)cfg->d_ff * cfg->d_model;
    void **ptrs[] = {(void **)&s->wb.w13, (void **)&s->wb.w2, (void **)&s->bias, (void **)&s->num_selected,
                     (void **)&s->counts, (void **)&s->expert_offset};
    const size_t nbytes[] = {EL * 2 * wcount * sizeof(moe_bf16), EL * wcount * sizeof(moe_bf16), E * sizeof(float),
                             E * sizeof(int), E * sizeof(int), (E + 1) * sizeof(int)};
    /* fp32 inputs: the router's logits are fp32 (core/precision.h) */
    st = moe_linear_plan_init(gpu, gemm, cfg->layout_invariant, 0,
                              cfg->d_model > cfg->num_experts ? cfg->d_model : cfg->num_experts, &s->router_rows);
    if (st == MOE_OK) st = moe_runtime_regrow(rt, ptrs, nbytes, 6);
    if (st == MOE_OK) st = moe_runtime_host_alloc(rt, E * sizeof(float), (void **)&s->bias_host);
    if (st == MOE_OK) st = moe_runtime_host_alloc(rt, E * sizeof(int), (void **)&s->num_selected_host);
    if (st == MOE_OK) st = moe_runtime_host_alloc(rt, sizeof(int), (void **)&s->nonfinite_host);
    if (st != MOE_OK) return cuda_destroy(s), st;
    *out = s;
    return MOE_OK;
}

static moe_status cuda_route(moe_layer_state *s, const moe_layer_weights *w, const moe_real *x, const moe_real *bias,
                             int use_given_experts, const moe_token_routing *r, int T) {
    const moe_config *c = &s->cfg;
    const int E = c->num_experts, k = c->top_k;
    const int sigmoid = c->score_func == MOE_SCORE_SIGMOID;
    if (sigmoid) {
        memcpy(s->bias_host, bias, (size_t)E * sizeof(float));
        MOE_TRY(moe_runtime_upload_async(s->rt, s->bias, s->bias_host, (size_t)E * sizeof(float)));
    }
    MOE_TRY(moe_router_logits_cuda(s->gpu, &s->router_rows, x, w->router_w, T, c->d_model, E, r->logits,
                                   s->nonfinite_host));
    MOE_TRY(moe_router_scores_cuda(s->gpu, c->score_func, r->logits, sigmoid ? s->bias : NULL, T, E, r->scores,
                                   r->select_scores));
    const float *select = sigmoid ? r->select_scores : r->scores;
    if (moe_config_grouped(c)) { /* only the token's best groups' experts (router/group.h) */
        MOE_TRY(moe_router_group_mask_cuda(s->gpu, select, T, E, c->num_groups, c->topk_groups, c->group_score,
                                           r->select_scores));
        select = r->select_scores;
    }
    if (!use_given_experts) MOE_TRY(moe_router_topk_cuda(s->gpu, select, T, E, k, r->expert));
    return moe_router_gates_cuda(s->gpu, r->scores, r->expert, T, E, k, c->renormalize, moe_config_gate_scale(c),
                                 r->expert_score, r->gate);
}

static moe_status cuda_choices_to_host(moe_layer_state *s, const moe_token_routing *r, int T, int with_scores,
                                       int *expert, moe_real *expert_score, int *nonfinite) {
    const int k = s->cfg.top_k;
    const size_t A = (size_t)T * k;
    MOE_TRY(moe_runtime_download_async(s->rt, expert, r->expert, A * sizeof(int)));
    if (with_scores) MOE_TRY(moe_runtime_download_async(s->rt, expert_score, r->expert_score, A * sizeof(float)));
    MOE_TRY(moe_runtime_synchronize(s->rt));
    *nonfinite = *s->nonfinite_host != 0;
    if (*nonfinite) { /* placeholders, as on the CPU: experts 0..k-1, the same on the device */
        moe_fail(MOE_ERR_NONFINITE, "layer %d: non-finite router logits (NaN or Inf)", s->cfg.layer_index);
        for (size_t a = 0; a < A; a++) expert[a] = (int)(a % k);
        if (with_scores) memset(expert_score, 0, A * sizeof(float));
        MOE_TRY(moe_runtime_upload(s->rt, r->expert, expert, A * sizeof(int)));
    }
    return MOE_OK;
}

static moe_status cuda_kept_to_device(moe_layer_state *s, const unsigned char *kept, const moe_token_routing *r,
                                      int T) {
    return moe_runtime_upload_async(s->rt, r->kept, kept, (size_t)T * s->cfg.top_k);
}

static moe_status cuda_dispatch_layout(moe_layer_state *s, const moe_token_routing *r, int T, int *layout_counts) {
    const moe_config *c = &s->cfg;
    return moe_router_dispatch_layout_cuda(s->gpu, r->expert, r->kept, T, c->num_experts, c->top_k, r->slot,
                                           r->perm_token, s->counts, s->expert_offset, layout_counts, NULL);
}

static moe_status cuda_permute(moe_layer_state *s, const moe_real *x, const int *perm_token, int num_rows, void *xp) {
    return moe_permute_rows_cuda(s->gpu, x, perm_token, num_rows, s->cfg.d_model, xp);
}

static moe_status cuda_combine(moe_layer_state *s, const void *y, const int *slot, const moe_real *gate, int T,
                               moe_real *out) {
    return moe_combine_rows_cuda(s->gpu, y, slot, gate, T, s->cfg.top_k, s->cfg.d_model, out);
}

static moe_status cuda_combine_backward(moe_layer_state *s, const moe_real *dout, const void *y, const int *slot,
                                        const moe_real *gate, int T, void *dy, moe_real *dgate) {
    return moe_combine_rows_backward_cuda(s->gpu, dout, y, slot, gate, T, s->cfg.top_k, s->cfg.d_model, dy, dgate);
}

/* h13, act for `rows` rows: the state's own, grown by a forward (grow 1), or the runtime's slots. */
static moe_status expert_acts(moe_layer_state *s, int rows, int grow) {
    const size_t n = (size_t)rows * s->cfg.d_ff * sizeof(moe_bf16);
    if (!moe_layer_keeps_expert_acts(&s->cfg)) {
        MOE_TRY(moe_runtime_scratch(s->rt, MOE_SCRATCH_KEEP_H_A, 2 * n, (void **)&s->h13));
        return moe_runtime_scratch(s->rt, MOE_SCRATCH_KEEP_H_B, n, (void **)&s->act);
    }
    if (rows <= s->max_rows) return MOE_OK;
    if (!grow) return MOE_ERR_NO_FORWARD;
    void **ptrs[] = {(void **)&s->h13, (void **)&s->act};
    const size_t nbytes[] = {2 * n, n};
    s->max_rows = 0;
    MOE_TRY(moe_runtime_regrow(s->rt, ptrs, nbytes, 2));
    s->max_rows = rows;
    return MOE_OK;
}

static moe_status cuda_experts_forward(moe_layer_state *s, const moe_layer_weights *w, const int *expert_offset,
                                       int rows, const void *xp, void *y) {
    const int EL = s->num_local_experts, d = s->cfg.d_model, f = s->cfg.d_ff;
    MOE_TRY(expert_acts(s, rows, 1));
    /* kept while w->version stays (core/types.h): once per optimizer step, not at every micro-batch and recompute
     * (at Mixtral's layer shape ~8 GB of memory traffic, ~3 ms of an H100, each time) */
    if (!w->version || w->version != s->wb_version || w->w1 != s->wb_w1) {
        s->wb_version = 0; /* a failed pack leaves nothing kept */
        MOE_TRY(moe_expert_weights_to_bf16_cuda(s->gpu, w, EL, d, f, &s->wb));
        s->wb_version = w->version, s->wb_w1 = w->w1;
    }
    return moe_expert_ffn_forward_cuda(s->gpu, s->gemm_mode, &s->wb, EL, d, f, expert_offset, xp, s->h13, s->act, y);
}

static moe_status cuda_experts_backward(moe_layer_state *s, const moe_layer_weights *w, moe_layer_weights *grads,
                                        const int *segment_start, int segments, int rows, const void *xp,
                                        const void *dy, void *dxp) {
    (void)w; /* the bf16 packs of the forward are the weights backward uses */
    const int EL = s->num_local_experts, d = s->cfg.d_model, f = s->cfg.d_ff;
    MOE_TRY(expert_acts(s, rows, 0));
    const size_t n = (size_t)rows * f * sizeof(moe_bf16);
    MOE_TRY(moe_runtime_scratch(s->rt, MOE_SCRATCH_EXPERT_DH_A, 2 * n, (void **)&s->dh13));
    MOE_TRY(moe_runtime_scratch(s->rt, MOE_SCRATCH_EXPERT_DH_B, n, (void **)&s->dact));
    void *wgrad_scratch = NULL; /* one for every layer of the runtime: their backward runs one at a time, in order
                                 * on its stream (a larger size frees the old buffer: cudaFree waits for the device) */
    /* leaves for one segment too under world-invariant sums with row blocks (experts/expert_ffn.h) */
    if (segments > 1 || (moe_expert_gemm_rows_invariant(s->gemm_mode) && s->cfg.num_shards > 0))
        MOE_TRY(moe_runtime_scratch(s->rt, MOE_SCRATCH_EXPERT_WGRAD,
                                    moe_expert_ffn_wgrad_scratch_count(d, f, segments) * sizeof(float), &wgrad_scratch));
    return moe_expert_ffn_backward_cuda(s->gpu, s->gemm_mode, &s->wb, grads, EL, d, f, segment_start, segments, xp,
                                        s->h13, s->act, dy, s->dh13, s->dact, dxp, wgrad_scratch);
}

static moe_status cuda_reserve_rows(moe_layer_state *s, int rows, int expert_rows) {
    (void)expert_rows; /* the GPU's expert GEMMs stage nothing per expert */
    MOE_TRY(expert_acts(s, rows, 1));
    const size_t n = (size_t)rows * s->cfg.d_ff * sizeof(moe_bf16);
    MOE_TRY(moe_runtime_scratch(s->rt, MOE_SCRATCH_EXPERT_DH_A, 2 * n, (void **)&s->dh13));
    return moe_runtime_scratch(s->rt, MOE_SCRATCH_EXPERT_DH_B, n, (void **)&s->dact);
}

/* Copies the values to the host and looks there: only used while looking for where a NaN came from. */
static moe_status cuda_find_nonfinite(moe_layer_state *s, const void *data, size_t count, int rows, long long *first) {
    const size_t elem = rows ? sizeof(moe_bf16) : sizeof(float);
    void *host = malloc(count ? count * elem : 1);
    if (!host) return MOE_ERR_OUT_OF_MEMORY;
    moe_status st = moe_runtime_download(s->rt, host, data, count * elem);
    *first = -1;
    for (size_t i = 0; i < count && st == MOE_OK; i++) {
        const float v = rows ? moe_bf16_to_float(((const moe_bf16 *)host)[i]) : ((const float *)host)[i];
        if (!isfinite(v)) {
            *first = (long long)i;
            break;
        }
    }
    free(host);
    return st;
}

static moe_status cuda_router_losses(moe_layer_state *s, const moe_token_routing *r, int T, const int *num_selected,
                                     int num_tokens_global, double loss[2]) {
    const moe_config *c = &s->cfg;
    const size_t nbytes = (size_t)c->num_experts * sizeof(int);
    /* The counts are the layer's, the same for each of its local shards: staged and uploaded once, not rewritten in
     * the pinned buffer while the previous shard's upload may still read it (a race, even with the same bytes).
     * Between forwards the layer's wait for its counts has drained the stream, and only this upload writes them. */
    if (!s->num_selected_staged || memcmp(s->num_selected_host, num_selected, nbytes)) {
        memcpy(s->num_selected_host, num_selected, nbytes);
        MOE_TRY(moe_runtime_upload_async(s->rt, s->num_selected, s->num_selected_host, nbytes));
        s->num_selected_staged = 1;
    }
    return moe_router_losses_queue_cuda(s->gpu, c->score_func, r->scores, r->logits, s->num_selected, T,
                                        num_tokens_global, c->num_experts, c->top_k, loss);
}

static moe_status cuda_router_backward(moe_layer_state *s, const moe_layer_weights *w, const moe_token_routing *r,
                                       int T, const moe_real *x, const moe_real *dgate, int num_tokens_global,
                                       moe_real *dx) {
    const moe_config *c = &s->cfg;
    const int Tg = num_tokens_global, E = c->num_experts, k = c->top_k;
    if (T > s->max_tokens) {
        void **ptrs[] = {(void **)&s->dscores, (void **)&s->dlogits};
        const size_t nbytes[] = {(size_t)T * E * sizeof(float), (size_t)T * E * sizeof(float)};
        s->max_tokens = 0;
        MOE_TRY(moe_runtime_regrow(s->rt, ptrs, nbytes, 2));
        s->max_tokens = T;
    }
    MOE_TRY(moe_runtime_zero(s->rt, s->dscores, (size_t)T * E * sizeof(float)));
    MOE_TRY(moe_router_gates_backward_cuda(s->gpu, r->scores, r->expert, dgate, T, E, k, c->renormalize,
                                           moe_config_gate_scale(c), s->dscores));
    MOE_TRY(moe_router_load_balance_loss_backward_cuda(s->gpu, c->score_func, r->scores, s->num_selected, T, Tg, E, k,
                                                       c->aux_loss_coef, s->dscores));
    MOE_TRY(moe_router_scores_backward_cuda(s->gpu, c->score_func, r->scores, s->dscores, T, E, s->dlogits));
    MOE_TRY(moe_router_z_loss_backward_cuda(s->gpu, r->logits, T, Tg, E, c->z_loss_coef, s->dlogits));
    /* queued, as every later reader of dx is: the transports order their streams after this one (comm_gpu.h), a
     * download waits for it */
    return moe_router_logits_backward_cuda(s->gpu, &s->router_rows, x, w->router_w, s->dlogits, T, c->d_model, E,
                                           NULL, dx);
}

static moe_status cuda_router_weight_grad(moe_layer_state *s, const moe_real *x, int first, int T, moe_real *dW) {
    const int d = s->cfg.d_model, E = s->cfg.num_experts;
    return moe_router_logits_backward_cuda(s->gpu, &s->router_rows, x + (size_t)first * d, NULL,
                                           s->dlogits + (size_t)first * E, T, d, E, dW, NULL); /* queued, as above */
}

static moe_status cuda_add(moe_layer_state *s, const moe_real *a, const moe_real *b, size_t n, moe_real *y) {
    return moe_add_cuda(s->gpu, a, b, n, y);
}

const moe_layer_ops moe_layer_ops_cuda = {
    .name = "cuda",
    .row_elem = sizeof(moe_bf16),
    .create = cuda_create,
    .destroy = cuda_destroy,
    .route = cuda_route,
    .choices_to_host = cuda_choices_to_host,
    .kept_to_device = cuda_kept_to_device,
    .dispatch_layout = cuda_dispatch_layout,
    .permute = cuda_permute,
    .combine = cuda_combine,
    .combine_backward = cuda_combine_backward,
    .experts_forward = cuda_experts_forward,
    .experts_backward = cuda_experts_backward,
    .find_nonfinite = cuda_find_nonfinite,
    .reserve_rows = cuda_reserve_rows,
    .router_losses = cuda_router_losses,
    .router_backward = cuda_router_backward,
    .router_weight_grad = cuda_router_weight_grad,
    .add = cuda_add,
};
