/* linear.h — the dense linear layer's products on the GPU (kernels/linear.cu), the CUDA twin of the row-wise GEMMs
 * of kernels/gemm_rows.h as moe/dense_ops_cpu.c uses them. Row-major, W [out, in], T token rows:
 *   forward          y[T, out]   = x[T, in] W^T
 *   backward input   dx[T, in]   = dy[T, out] W + beta dx
 *   backward weight  dW[out, in] = dy^T x + beta dW
 * beta is 0 (C is overwritten, not read) or 1; anything else is MOE_ERR_INVALID_ARG.
 *
 * fp32 cublasSgemm under the context's pedantic math mode (no TF32). bf16 precision: the caller rounds the inputs
 * to bf16 and keeps them in fp32 buffers (moe_bf16_round_cuda), as the model keeps its bf16 weight copies; products
 * of bf16 values are exact in fp32, so this SGEMM computes what a bf16 GEMM with fp32 accumulation computes, up to
 * the order of the sums (core/precision.h). cublasGemmEx on bf16-typed buffers would need a second copy of every
 * weight and activation as moe_bf16; the SGEMM on rounded values needs none.
 *
 * Row blocks (layout_invariant): the calls of kernels/linear_gemms.h, every row-wise call MOE_GEMM_ROW_BLOCK rows,
 * the last partial block padded through the plan's buffers, so that cuBLAS runs one shape for every block.
 *
 * One pinned cuBLASLt call per product (MOE_LINEAR_LT; issue 50, item 2): each product is one cublasLtMatmul with the
 * algorithm kernels/gemm_lt.h pins for its shape at the shape's first call and reuses for every row count, so that a
 * row's result depends on its own inputs only (why: gemm_lt.h), with or without layout_invariant. bf16_inputs: the
 * products take bf16 inputs with fp32 accumulation (CUBLAS_COMPUTE_32F on tensor cores); else fp32 without TF32 (the
 * router's; CUBLAS_COMPUTE_32F_PEDANTIC). The inputs stay fp32 buffers: each call casts both operands to bf16 into
 * the context set's scratch (kernels/cast.h's rounding: round to nearest even), so the token operands (x, dy) may come
 * unrounded, and the caller spares the pass that would round them first (moe/dense_ops_cuda.c's stage()); a shape
 * without a pinned algorithm rounds them into the plan's `rounded` before its SGEMM, the same values. The weights must
 * hold bf16 values (the caller's bf16 copies: the SGEMM fallback does not round them). What the casts cost: a read of
 * 4 and a write of 2 bytes per element of both operands at every call, the weight's included (at Mixtral's down
 * projection, W [4096, 14336] and 8192 rows: 1.06 GB, ~0.35 ms at 3 TB/s beside a ~1.5 ms GEMM at 650 TFLOP/s, so
 * ~25% on top), and scratch the size of the largest operands in bf16 (0.35 GB there). Kept weights (bf16 inputs): with
 * a weights version set (moe_linear_plan_set_weights_version, as the CPU's gemm_rows.h keeps its prepared copies), the
 * plan keeps the bf16 copy of every W it meets (per address and shape; forward and backward input read the same
 * [out, in] copy, rows padded alike) and casts it again only when the version has changed: once per optimizer step
 * instead of at each of the step's forward, recomputed forward and backward calls of every micro-batch. The caller
 * promises that a W's values change only with the version (the model's bf16 copies change with the parameters); a
 * copy is made at a W's first call (device memory, counted: the first step's) and freed with the plan;
 * MOE_LINEAR_KEEP_WEIGHTS=0 in the environment keeps none (every call casts W: tests/test_gpu_train.sh's check that
 * keeping them changes no bit). bf16
 * activations written by their producers (issue 50, item 4) would remove the token operands' casts too; the
 * benchmark (bench/bench_gemm_lt.cu) times the call with and without the casts. A shape for which cuBLASLt offers no
 * such algorithm runs as MOE_LINEAR_SGEMM would (row blocks when layout_invariant), every time, and
 * moe_linear_plan_describe says why. Not yet the default: it has not run on a GPU (MOE_LINEAR_GEMM=lt selects it).
 * A shape's first call plans it (host calls only, no device work); growing the scratch waits for the stream.
 * Device pointers, queued on gpu's stream, no host sync. */
#ifndef MOE_KERNELS_LINEAR_H
#define MOE_KERNELS_LINEAR_H

#include <stddef.h>

#include "core/gpu.h"
#include "kernels/gemm_lt.h"

typedef enum {
    MOE_LINEAR_SGEMM = 0, /* cublasSgemm on the fp32 buffers (in row blocks when layout_invariant): the default */
    MOE_LINEAR_LT = 1,    /* one pinned cuBLASLt call per product (above) */
} moe_linear_gemm;

/* The environment's choice: MOE_LINEAR_GEMM unset, empty or "sgemm": MOE_LINEAR_SGEMM; "lt": MOE_LINEAR_LT; anything
 * else MOE_ERR_INVALID_CONFIG, naming the two. */
moe_status moe_linear_gemm_from_env(moe_linear_gemm *out);

/* MOE_LINEAR_LT's token operands rounded for a shape that runs as SGEMM (linear.cu), grown on demand */
typedef struct {
    float *data;
    size_t nbytes;
} moe_linear_rounded;

typedef struct {
    int layout_invariant;
    int max_width;           /* the widest row of an input or output (in, out) */
    float *pad_in, *pad_out; /* [MOE_GEMM_ROW_BLOCK, max_width] each, device: the padded block; NULL without blocks */
    int bf16_inputs;         /* the inputs hold bf16 values: MOE_LINEAR_LT runs them as bf16 */
    moe_gemm_lt_set *lt;     /* MOE_LINEAR_LT: the context's pinned GEMMs by shape and their scratch (shared with every
                                other user of the context: moe_gemm_lt_context_set); NULL: MOE_LINEAR_SGEMM */
    moe_linear_rounded *rounded; /* MOE_LINEAR_LT with bf16 inputs: the SGEMM fallback's rounded x and dy; else NULL */
    struct moe_linear_kept *kept; /* MOE_LINEAR_LT with bf16 inputs: the kept weights (above); else NULL */
} moe_linear_plan;

moe_status moe_linear_plan_init(moe_gpu *gpu, moe_linear_gemm gemm, int layout_invariant, int bf16_inputs,
                                int max_width, moe_linear_plan *plan);
void moe_linear_plan_free(moe_gpu *gpu, moe_linear_plan *plan);
/* The weights the products read have this version from now on (0: keep none, cast W at every call); a plan without
 * kept weights ignores it. */
void moe_linear_plan_set_weights_version(const moe_linear_plan *plan, unsigned long long version);
/* The weights kept so far (their bf16 copies: for tests and logs). */
int moe_linear_plan_kept_weights(const moe_linear_plan *plan);

/* How the plan runs its products, for a log or the run record: "cublasSgemm in 64-row blocks", or "cuBLASLt, one pinned
 * call per product" and a line per shape the context has met so far (moe_gemm_lt_set_describe: its configuration, or
 * why it has none and runs as SGEMM). Returns what snprintf would. */
int moe_linear_plan_describe(const moe_linear_plan *plan, char *out, size_t n);

moe_status moe_linear_forward_cuda(moe_gpu *gpu, const moe_linear_plan *plan, const float *x, const float *W, int rows,
                                   int in, int out, float *y);
moe_status moe_linear_backward_input_cuda(moe_gpu *gpu, const moe_linear_plan *plan, const float *dy, const float *W,
                                          int rows, int in, int out, float beta, float *dx);
moe_status moe_linear_backward_weight_cuda(moe_gpu *gpu, const moe_linear_plan *plan, const float *dy, const float *x,
                                           int rows, int in, int out, float beta, float *dW);

#endif
