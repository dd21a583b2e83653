/* precision.h — what runs in bf16, decided here once for the CPU and the CUDA paths.
 *
 *   fp32: every GEMM takes fp32 inputs.
 *   bf16: the GEMMs of the experts and of the dense layers (attention projections, dense FFNs, lm_head), forward
 *         and backward, take bf16 copies of their weights and activations (rounded to nearest even), accumulate
 *         in fp32 and write fp32; so do the fused attention's products (q k^T, P v and their backward: q, k, v,
 *         dout, P and dS rounded where FlashAttention-2's tensor-core kernels round them, kernels/attention.h).
 *         Everything else stays fp32: the master weights, the optimizer state, the gradients and their
 *         reductions, norms, softmax and its statistics, losses, the embedding lookup, the materialized
 *         attention (--attention materialized, the S x S reference), and the router (its logits GEMM too:
 *         routing decisions are made in fp32, as every MoE trainer does; a bf16 logit would flip top-k choices at
 *         ties).
 *
 * A bf16 input times a bf16 input is exact in fp32, so a bf16 GEMM with fp32 accumulation computes the same as an
 * fp32 GEMM of the rounded inputs, up to the order of the sums: which is how a CPU without a bf16 kernel runs it, and
 * a CPU whose fp32 units outrun its bf16 kernels (kernels/gemm_engine.h, MOE_BF16_GEMM). */
#ifndef MOE_CORE_PRECISION_H
#define MOE_CORE_PRECISION_H

typedef enum { MOE_PRECISION_FP32 = 0, MOE_PRECISION_BF16 = 1 } moe_precision;

/* The GEMMs of a training step, by what they compute. */
typedef enum {
    MOE_GEMM_ROUTER,    /* router logits and their gradients                      */
    MOE_GEMM_EXPERTS,   /* the SwiGLU experts of an MoE layer                      */
    MOE_GEMM_DENSE,     /* attention projections, dense SwiGLU FFNs, lm_head       */
    MOE_GEMM_ATTENTION, /* q k^T and att v inside the fused attention (and their backward) */
} moe_gemm_site;

/* 1 when the GEMMs at `site` take bf16 inputs under precision p (they always accumulate and write fp32). */
int moe_precision_bf16_inputs(moe_precision p, moe_gemm_site site);

/* "fp32" or "bf16"; and back (-1 for anything else). */
const char *moe_precision_name(moe_precision p);
int moe_precision_parse(const char *name);

#endif
