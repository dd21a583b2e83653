/* expert_ffn.h — SwiGLU experts over rows grouped by expert (a grouped GEMM), forward and backward. CPU and
 * CUDA.
 *
 * For expert e and its rows X_e = xp[offset[e] : offset[e+1]]  (n_e rows of width d):
 *   H1 = X_e W1_e^T,  H3 = X_e W3_e^T        [n_e, d_ff]
 *   A  = silu(H1) * H3                        [n_e, d_ff]     silu(h) = h * sigmoid(h)
 *   Y_e = A W2_e^T                            [n_e, d]
 * Weight shapes are Mixtral's (moe.h). num_experts here is the number of local experts. */
#ifndef MOE_EXPERTS_EXPERT_FFN_H
#define MOE_EXPERTS_EXPERT_FFN_H

#include "kernels/gemm_rows.h"
#include "core/gpu.h"
#include "core/types.h"

/* h1, h3, act: [offset[E], d_ff] saved for backward; y: [offset[E], d], or NULL: the intermediates only (what
 * recomputation before backward needs, moe/moe.h's moe_recompute);
 * gemm: how the row-wise products are cut into calls (kernels/gemm_rows.h). */
moe_status moe_expert_ffn_forward_cpu(const moe_layer_weights *w, int num_experts, int d_model, int d_ff,
                                      const int *expert_offset, const moe_real *xp, moe_real *h1, moe_real *h3,
                                      moe_real *act, moe_real *y, moe_gemm_rows_plan *gemm);

/* From dy [rows, d]: dxp = dH1 W1 + dH3 W3 (overwritten) and grads->w1, w3, w2 += their GEMMs.
 * The rows of expert e arrive as `segments` consecutive segments: one per source rank of the EP group, or with
 * the batch split into virtual shards (moe_config.num_shards) one per source shard, in global shard order:
 * segment s starts at row segment_start[e * segments + s], and segment_start[E * segments] = all rows.
 * Each weight gradient is summed as one product per segment, each formed whole (an empty segment's is zero),
 * the products added in the fixed binary tree over the segments (tree_reduce.h's tree; in segment order when
 * `segments` is not a power of two; core/tree_schedule.h gives that order as steps, which the CUDA twin
 * follows). A replica forms the subtree of its EP group's shards, and the replicas' tree all-reduce the levels
 * above, so sharded and replicated experts, on any power-of-two world, form the same
 * sum (docs/DETERMINISM.md). dh1, dh3: scratch of [rows, d_ff]; wgrad_scratch:
 * moe_expert_ffn_wgrad_scratch_count(d, d_ff, segments) reals. grads->router_w is not touched. */
size_t moe_expert_ffn_wgrad_scratch_count(int d_model, int d_ff, int segments);
/* What forward and backward stage per expert (kernels/gemm_rows.h's slots: its rows x and dy, its intermediates
 * act, dh1 and dh3), grown now for experts of up to expert_rows rows, so that later passes of no more rows allocate
 * nothing (moe/layer_ops.h's reserve_rows). */
moe_status moe_expert_ffn_reserve_cpu(moe_gemm_rows_plan *gemm, int d_model, int d_ff, int expert_rows);
moe_status moe_expert_ffn_backward_cpu(const moe_layer_weights *w, moe_layer_weights *grads, int num_experts,
                                       int d_model, int d_ff, const int *segment_start, int segments,
                                       const moe_real *xp, const moe_real *h1, const moe_real *h3, const moe_real *act,
                                       const moe_real *dy, moe_real *dh1, moe_real *dh3, moe_real *dxp,
                                       moe_real *wgrad_scratch, moe_gemm_rows_plan *gemm);

/* CUDA: bf16 weights and activations, fp32 accumulation, fp32 weight gradients (DESIGN.md, Precision). Host
 * syncs: none in the per-expert mode; the grouped mode copies its pointer arrays from pageable host memory,
 * which waits for the stream once per call.
 * Per local expert e the gate and up projections are packed into one bf16 matrix W13_e = [W1_e; W3_e]
 * [2*d_ff, d], so H13 = X W13^T is one GEMM and dX = dH13 W13 another (K = 2*d_ff); W2_e [d, d_ff].
 * The GEMMs of all experts run as one cublasGemmGroupedBatchedEx call per projection, or as one
 * cublasGemmEx per expert (moe_expert_gemm_mode; bench/bench_grouped_gemm measures both). Experts with zero
 * rows are skipped: nothing of theirs is read or written. */
typedef enum {
    MOE_EXPERT_GEMM_GROUPED = 0,    /* cublasGemmGroupedBatchedEx: one call per projection */
    MOE_EXPERT_GEMM_PER_EXPERT = 1, /* one cublasGemmEx per expert and projection */
    /* layout invariance (moe_config.layout_invariant): one cublasGemmEx per expert, projection and fixed block of
     * MOE_GEMM_ROW_BLOCK rows (kernels/linear_gemms.h's calls: the last partial block padded through scratch), so
     * that cuBLAS runs one shape whatever an expert's row count and a row's bits do not depend on it (cuBLAS picks
     * its kernel by shape); given wgrad_scratch, one segment's weight gradients as leaves too (below) */
    MOE_EXPERT_GEMM_ROW_BLOCKS = 2,
    /* layout invariance in one call per expert and row projection (issue 50, item 2): cuBLASLt with the algorithm
     * kernels/gemm_lt.h pins per shape (bf16 in, fp32 sum, bf16 out) and reuses for every row count, so a row's bits
     * are its own whatever the expert's rows; a projection whose shape cuBLASLt has no such algorithm for, or whose
     * widths are not multiples of 8, runs in ROW_BLOCKS' blocks (decided by the shape alone). Weight gradients and
     * leaves as ROW_BLOCKS'. MOE_LINEAR_GEMM=lt selects it where the layer is layout-invariant
     * (moe/layer_ops_cuda.c) */
    MOE_EXPERT_GEMM_LT = 3,
} moe_expert_gemm_mode;

/* The modes whose row projections give a row the same bits whatever the expert's row count (ROW_BLOCKS, LT). */
static inline int moe_expert_gemm_rows_invariant(moe_expert_gemm_mode mode) {
    return mode == MOE_EXPERT_GEMM_ROW_BLOCKS || mode == MOE_EXPERT_GEMM_LT;
}

typedef struct {
    moe_bf16 *w13; /* [E_local, 2*d_ff, d] */
    moe_bf16 *w2;  /* [E_local, d, d_ff]   */
} moe_expert_weights_bf16;

/* Packs and rounds this rank's fp32 master weights (device views, moe_layer_weights_view) into bf16. */
moe_status moe_expert_weights_to_bf16_cuda(moe_gpu *gpu, const moe_layer_weights *w, int num_experts, int d_model,
                                           int d_ff, moe_expert_weights_bf16 *out);

/* expert_offset: HOST array [E+1] (the dispatch plan's). h13 [rows, 2*d_ff] and act [rows, d_ff] are
 * kept for backward; y [rows, d], or NULL: the intermediates only. act = silu(H1) * H3 computed in fp32 from the bf16 H13, stored bf16. */
moe_status moe_expert_ffn_forward_cuda(moe_gpu *gpu, moe_expert_gemm_mode mode, const moe_expert_weights_bf16 *w,
                                       int num_experts, int d_model, int d_ff, const int *expert_offset,
                                       const moe_bf16 *xp, moe_bf16 *h13, moe_bf16 *act, moe_bf16 *y);

/* From dy [rows, d]: dxp [rows, d] (overwritten) and grads->w1, w3, w2 (device fp32 views) += the weight
 * GEMMs (fp32 output). segment_start, segments: HOST, as moe_expert_ffn_backward_cpu's, and the same sum: with
 * segments == 1 one product per expert and projection straight into the gradient (beta = 1); with more, one
 * product per segment into a scratch leaf (beta = 0; an empty segment's leaf is zeroed), the leaves added in
 * tree_schedule.h's steps by an fp32 add kernel (moe_add_cuda: element-wise, each sum rounded once), the last step
 * adding into the gradient. In MOE_EXPERT_GEMM_ROW_BLOCKS and _LT modes with wgrad_scratch, one segment's product is
 * such a leaf too, then added into the gradient: world-invariant sums need the same GEMM whatever the number of
 * segments (a rank holding one shard of an expert's rows, another holding two). The row projections are the mode's, per
 * expert over all its rows whatever the segments.
 * dh13: scratch [rows, 2*d_ff], dact: scratch [rows, d_ff]; wgrad_scratch: device,
 * moe_expert_ffn_wgrad_scratch_count(d, d_ff, segments) floats; may be NULL when segments == 1 (the single beta-1
 * product then). */
moe_status moe_expert_ffn_backward_cuda(moe_gpu *gpu, moe_expert_gemm_mode mode, const moe_expert_weights_bf16 *w,
                                        moe_layer_weights *grads, int num_experts, int d_model, int d_ff,
                                        const int *segment_start, int segments, const moe_bf16 *xp,
                                        const moe_bf16 *h13, const moe_bf16 *act, const moe_bf16 *dy, moe_bf16 *dh13,
                                        moe_bf16 *dact, moe_bf16 *dxp, float *wgrad_scratch);

/* The fused elementwise parts (exposed for tests): act = silu(h1) * h3, and its backward
 * dh1 = dact * h3 * silu'(h1), dh3 = dact * silu(h1), all in fp32 math on bf16 storage; h13 rows are
 * [h1 (d_ff) | h3 (d_ff)]. */
moe_status moe_swiglu_forward_cuda(moe_gpu *gpu, const moe_bf16 *h13, int rows, int d_ff, moe_bf16 *act);
moe_status moe_swiglu_backward_cuda(moe_gpu *gpu, const moe_bf16 *h13, const moe_bf16 *dact, int rows, int d_ff,
                                    moe_bf16 *dh13);

#endif
