/* backend_cuda.c — the CUDA backend of the layer (moe/backend.h): device memory, the _cuda ops of router/,
 * kernels/ and experts/, all queued on the layout's moe_gpu stream. Router and losses in fp32; expert
 * rows, exchanges and expert GEMMs in bf16 with fp32 accumulation; fp32 master weights and gradients.
 *
 * Host round trips per forward (each small next to the rows): the top-k choices (T*k ints, and their
 * scores when capacity drops by score) for the global capacity rule and this rank's kept flags back
 * (layer.c), the per-expert counts and offsets for the dispatch plan, the two loss shares.
 *
 * Expert GEMMs: MOE_EXPERT_GEMM_PER_EXPERT by default; MOE_EXPERT_GEMM=grouped in the environment selects
 * cublasGemmGroupedBatchedEx (bench/bench_grouped_gemm compares them; docs/BENCHMARKS.md). */
#include <stdlib.h>
#include <string.h>

#include "core/gpu_cuda.h"

#include "alltoall/parallel.h"
#include "experts/expert_ffn.h"
#include "kernels/permute.h"
#include "moe/backend.h"
#include "router/aux_loss.h"
#include "router/gates.h"
#include "router/layout.h"
#include "router/scores.h"
#include "router/topk.h"

_Static_assert(sizeof(moe_real) == sizeof(float), "the CUDA backend is float only");

struct moe_backend {
    moe_config cfg;
    int num_local_experts;
    moe_gpu *gpu;
    moe_expert_gemm_mode gemm_mode;
    moe_expert_weights_bf16 wb;      /* bf16 packs of this rank's experts, remade every forward */
    int *offsets;                /* host [E_local + 1] expert offsets of the received rows (backward) */
    int max_rows;
    moe_bf16 *h13, *act;         /* [rows, 2 d_ff], [rows, d_ff] kept from forward */
    moe_bf16 *dh13, *dact;       /* backward scratch of the same shapes */
    int max_tokens;
    float *dscores, *dlogits;    /* [T, E] router backward scratch */
    float *bias;                 /* [E] selection bias (sigmoid routing) */
    int *num_selected;           /* [E] global top-k counts, for the balance loss and its gradient */
    int *counts, *expert_offset; /* [E], [E + 1] the layout's, on the device */
};

static void free_ptrs(moe_gpu *gpu, void **ptrs[], int n) {
    for (int i = 0; i < n; i++) moe_gpu_free(gpu, *ptrs[i]), *ptrs[i] = NULL;
}

/* Frees and reallocates n device buffers of nbytes[i] each (contents are not kept). */
static moe_status regrow(moe_gpu *gpu, void **ptrs[], const size_t *nbytes, int n) {
    free_ptrs(gpu, ptrs, n);
    for (int i = 0; i < n; i++) MOE_TRY(moe_gpu_alloc(gpu, nbytes[i], ptrs[i]));
    return MOE_OK;
}

static void cuda_destroy(moe_backend *b) {
    if (!b) return;
    void **ptrs[] = {(void **)&b->wb.w13, (void **)&b->wb.w2, (void **)&b->h13, (void **)&b->act,
                     (void **)&b->dh13, (void **)&b->dact, (void **)&b->dscores, (void **)&b->dlogits,
                     (void **)&b->bias, (void **)&b->num_selected, (void **)&b->counts, (void **)&b->expert_offset};
    free_ptrs(b->gpu, ptrs, sizeof ptrs / sizeof *ptrs);
    free(b->offsets);
    free(b);
}

static moe_status cuda_create(const moe_config *cfg, const moe_parallel *par, moe_backend **out) {
    if (!par || !par->gpu) return MOE_ERR_NO_DEVICE;
    moe_backend *b = calloc(1, sizeof *b);
    if (!b) return MOE_ERR_OUT_OF_MEMORY;
    b->cfg = *cfg;
    b->num_local_experts = cfg->num_experts / cfg->ep_size;
    b->gpu = par->gpu;
    const char *mode = getenv("MOE_EXPERT_GEMM");
    b->gemm_mode = mode && !strcmp(mode, "grouped") ? MOE_EXPERT_GEMM_GROUPED : MOE_EXPERT_GEMM_PER_EXPERT;
    size_t EL = b->num_local_experts, E = cfg->num_experts, wcount = (size_t)cfg->d_ff * cfg->d_model;
    void **ptrs[] = {(void **)&b->wb.w13, (void **)&b->wb.w2, (void **)&b->bias, (void **)&b->num_selected,
                     (void **)&b->counts, (void **)&b->expert_offset};
    const size_t nbytes[] = {EL * 2 * wcount * sizeof(moe_bf16), EL * wcount * sizeof(moe_bf16), E * sizeof(float),
                             E * sizeof(int), E * sizeof(int), (E + 1) * sizeof(int)};
    b->offsets = malloc((EL + 1) * sizeof(int));
    moe_status st = b->offsets ? regrow(b->gpu, ptrs, nbytes, 6) : MOE_ERR_OUT_OF_MEMORY;
    if (st != MOE_OK) return cuda_destroy(b), st;
    *out = b;
    return MOE_OK;
}

static moe_status cuda_alloc(moe_backend *b, size_t nbytes, void **out) { return moe_gpu_alloc(b->gpu, nbytes, out); }
static void cuda_free(moe_backend *b, void *ptr) { moe_gpu_free(b->gpu, ptr); }
static moe_status cuda_upload(moe_backend *b, void *dst, const void *src, size_t n) { return moe_gpu_upload(b->gpu, dst, src, n); }
static moe_status cuda_download(moe_backend *b, void *dst, const void *src, size_t n) {
    return moe_gpu_download(b->gpu, dst, src, n);
}
static moe_status cuda_copy(moe_backend *b, void *dst, const void *src, size_t n) { return moe_gpu_copy(b->gpu, dst, src, n); }

/* The routing's per-token arrays, in the order of routing.h, with their sizes per token. */
#define ROUTING_DEVICE_ARRAYS(r) \
    {(void **)&(r)->logits, (void **)&(r)->scores, (void **)&(r)->select_scores, (void **)&(r)->expert, \
     (void **)&(r)->gate, (void **)&(r)->expert_score, (void **)&(r)->kept, (void **)&(r)->slot, (void **)&(r)->perm_token}

static void cuda_routing_free(moe_backend *b, moe_routing *r) {
    void **ptrs[] = ROUTING_DEVICE_ARRAYS(r);
    free_ptrs(b->gpu, ptrs, sizeof ptrs / sizeof *ptrs);
    free(r->num_selected_per_expert), free(r->num_tokens_per_expert), free(r->expert_offset);
    free(r->num_tokens_per_rank);
    memset(r, 0, sizeof *r);
}

static moe_status cuda_routing_alloc(moe_backend *b, moe_routing *r, int max_tokens, int num_experts, int top_k,
                                     int num_ranks) {
    memset(r, 0, sizeof *r);
    r->num_experts = num_experts, r->top_k = top_k, r->num_ranks = num_ranks;
    size_t te = (size_t)max_tokens * num_experts, tk = (size_t)max_tokens * top_k;
    void **ptrs[] = ROUTING_DEVICE_ARRAYS(r);
    const size_t nbytes[] = {te * sizeof(float), te * sizeof(float), te * sizeof(float), tk * sizeof(int),
                             tk * sizeof(float), tk * sizeof(float), tk, tk * sizeof(int), tk * sizeof(int)};
    _Static_assert(sizeof nbytes / sizeof *nbytes == 9, "one size per routing array");
    moe_status st = regrow(b->gpu, ptrs, nbytes, 9);
    r->num_selected_per_expert = calloc(num_experts, sizeof(int));
    r->num_tokens_per_expert = calloc(num_experts, sizeof(int));
    r->expert_offset = calloc(num_experts + 1, sizeof(int));
    r->num_tokens_per_rank = calloc(num_ranks, sizeof(int));
    if (!r->num_selected_per_expert || !r->num_tokens_per_expert || !r->expert_offset || !r->num_tokens_per_rank)
        st = MOE_ERR_OUT_OF_MEMORY;
    if (st != MOE_OK) cuda_routing_free(b, r);
    return st;
}

static moe_status cuda_route(moe_backend *b, const moe_layer_weights *w, const moe_real *x, const moe_real *bias,
                             int use_given_experts, moe_routing *r) {
    const moe_config *c = &b->cfg;
    const int T = r->num_tokens, E = c->num_experts, k = c->top_k;
    const int sigmoid = c->score_func == MOE_SCORE_SIGMOID;
    if (sigmoid) MOE_TRY(moe_gpu_upload(b->gpu, b->bias, bias, E * sizeof(float)));
    MOE_TRY(moe_router_logits_cuda(b->gpu, x, w->router_w, T, c->d_model, E, r->logits));
    MOE_TRY(moe_router_scores_cuda(b->gpu, c->score_func, r->logits, sigmoid ? b->bias : NULL, T, E, r->scores,
                               r->select_scores));
    if (!use_given_experts)
        MOE_TRY(moe_router_topk_cuda(b->gpu, sigmoid ? r->select_scores : r->scores, T, E, k, r->expert));
    return moe_router_gates_cuda(b->gpu, r->scores, r->expert, T, E, k, c->renormalize, r->expert_score, r->gate);
}

static moe_status cuda_dispatch_layout(moe_backend *b, moe_routing *r) {
    MOE_TRY(moe_router_dispatch_layout_cuda(b->gpu, r->expert, r->kept, r->num_tokens, r->num_experts, r->top_k, r->slot,
                                        r->perm_token, b->counts, b->expert_offset, r->num_tokens_per_expert,
                                        r->expert_offset));
    moe_routing_count_totals(r);
    return MOE_OK;
}

static moe_status cuda_permute(moe_backend *b, const moe_real *x, const int *perm_token, int num_rows, int d,
                               void *xp) {
    return moe_permute_rows_cuda(b->gpu, x, perm_token, num_rows, d, xp);
}

static moe_status cuda_combine(moe_backend *b, const void *y, const int *slot, const moe_real *gate, int num_tokens,
                               int top_k, int d, moe_real *out) {
    return moe_combine_rows_cuda(b->gpu, y, slot, gate, num_tokens, top_k, d, out);
}

static moe_status cuda_combine_backward(moe_backend *b, const moe_real *dout, const void *y, const int *slot,
                                        const moe_real *gate, int num_tokens, int top_k, int d, void *dy,
                                        moe_real *dgate) {
    return moe_combine_rows_backward_cuda(b->gpu, dout, y, slot, gate, num_tokens, top_k, d, dy, dgate);
}

static moe_status cuda_experts_forward(moe_backend *b, const moe_layer_weights *w, const int *expert_offset, int rows,
                                       const void *xp, void *y) {
    const int EL = b->num_local_experts, d = b->cfg.d_model, f = b->cfg.d_ff;
    if (rows > b->max_rows) {
        void **ptrs[] = {(void **)&b->h13, (void **)&b->act, (void **)&b->dh13, (void **)&b->dact};
        size_t n = (size_t)rows * f * sizeof(moe_bf16);
        const size_t nbytes[] = {2 * n, n, 2 * n, n};
        b->max_rows = 0;
        MOE_TRY(regrow(b->gpu, ptrs, nbytes, 4));
        b->max_rows = rows;
    }
    MOE_TRY(moe_expert_weights_to_bf16_cuda(b->gpu, w, EL, d, f, &b->wb));
    return moe_expert_ffn_forward_cuda(b->gpu, b->gemm_mode, &b->wb, EL, d, f, expert_offset, xp, b->h13, b->act, y);
}

static moe_status cuda_experts_backward(moe_backend *b, const moe_layer_weights *w, moe_layer_weights *grads,
                                        const int *segment_start, int segments, int rows, const void *xp,
                                        const void *dy, void *dxp) {
    (void)w; /* the bf16 packs of the forward are the weights backward uses */
    const int EL = b->num_local_experts;
    if (rows > b->max_rows) return MOE_ERR_NO_FORWARD;
    /* one GEMM per expert over all its rows: its segments are consecutive */
    for (int e = 0; e <= EL; e++) b->offsets[e] = segment_start[(size_t)e * segments];
    return moe_expert_ffn_backward_cuda(b->gpu, b->gemm_mode, &b->wb, grads, EL, b->cfg.d_model, b->cfg.d_ff, b->offsets,
                                    xp, b->h13, b->act, dy, b->dh13, b->dact, dxp);
}

static moe_status cuda_router_losses(moe_backend *b, const moe_routing *r, int num_tokens_global, double loss[2]) {
    const moe_config *c = &b->cfg;
    MOE_TRY(moe_gpu_upload(b->gpu, b->num_selected, r->num_selected_per_expert, c->num_experts * sizeof(int)));
    return moe_router_losses_cuda(b->gpu, c->score_func, r->scores, r->logits, b->num_selected, r->num_tokens,
                              num_tokens_global, c->num_experts, c->top_k, loss);
}

static moe_status cuda_router_backward(moe_backend *b, const moe_layer_weights *w, const moe_routing *r,
                                       const moe_real *x, const moe_real *dgate, int num_tokens_global,
                                       moe_layer_weights *grads, moe_real *dx) {
    const moe_config *c = &b->cfg;
    const int T = r->num_tokens, Tg = num_tokens_global, E = c->num_experts, k = c->top_k;
    if (T > b->max_tokens) {
        void **ptrs[] = {(void **)&b->dscores, (void **)&b->dlogits};
        const size_t nbytes[] = {(size_t)T * E * sizeof(float), (size_t)T * E * sizeof(float)};
        b->max_tokens = 0;
        MOE_TRY(regrow(b->gpu, ptrs, nbytes, 2));
        b->max_tokens = T;
    }
    MOE_TRY(moe_gpu_zero(b->gpu, b->dscores, (size_t)T * E * sizeof(float)));
    MOE_TRY(moe_router_gates_backward_cuda(b->gpu, r->scores, r->expert, r->gate, dgate, T, E, k, c->renormalize,
                                       b->dscores));
    MOE_TRY(moe_router_load_balance_loss_backward_cuda(b->gpu, c->score_func, r->scores, b->num_selected, T, Tg, E, k,
                                                   c->aux_loss_coef, b->dscores));
    MOE_TRY(moe_router_scores_backward_cuda(b->gpu, c->score_func, r->scores, b->dscores, T, E, b->dlogits));
    MOE_TRY(moe_router_z_loss_backward_cuda(b->gpu, r->logits, T, Tg, E, c->z_loss_coef, b->dlogits));
    MOE_TRY(moe_router_logits_backward_cuda(b->gpu, x, w->router_w, b->dlogits, T, c->d_model, E, grads->router_w, dx));
    /* the caller reads dx and the gradients on other streams, or from the host: finish here */
    return moe_gpu_synchronize(b->gpu);
}

const moe_backend_ops moe_backend_cuda = {
    .name = "cuda",
    .row_elem = sizeof(moe_bf16),
    .create = cuda_create,
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .routing_alloc = cuda_routing_alloc,
    .routing_free = cuda_routing_free,
    .route = cuda_route,
    .dispatch_layout = cuda_dispatch_layout,
    .permute = cuda_permute,
    .combine = cuda_combine,
    .combine_backward = cuda_combine_backward,
    .experts_forward = cuda_experts_forward,
    .experts_backward = cuda_experts_backward,
    .router_losses = cuda_router_losses,
    .router_backward = cuda_router_backward,
};
