/* attention.h — causal multi-head self-attention with grouped-query heads (GQA). CPU (cblas GEMMs) and CUDA
 * (cuBLAS strided-batched GEMMs).
 * q: [num_seqs * S, H, hd]; k, v: [num_seqs * S, KV, hd], KV divides H; query head h reads kv head
 * h / (H / KV) (Hugging Face's repeat_kv). Per sequence and head:
 *   P = softmax(q k^T / sqrt(hd) + causal mask)  [S, S],  out = P v  [S, hd]
 * Every sequence is computed on its own, so results do not depend on which sequences share a call. */
#ifndef MOE_KERNELS_ATTENTION_H
#define MOE_KERNELS_ATTENTION_H

#include "core/gpu.h"
#include "core/types.h"

/* att: [num_seqs, H, S, S] probabilities saved for backward (entries above the diagonal are 0);
 * out: [num_seqs * S, H, hd]. */
void moe_attention_forward_cpu(const moe_real *q, const moe_real *k, const moe_real *v, int num_seqs, int seq_len,
                               int num_heads, int num_kv_heads, int head_dim, moe_real *att, moe_real *out);

/* Overwrites dq [num_seqs * S, H, hd], dk and dv [num_seqs * S, KV, hd]. scratch: moe_threads_get() * S * S reals
 * (one [S, S] per thread, core/threads.h). */
void moe_attention_backward_cpu(const moe_real *q, const moe_real *k, const moe_real *v, const moe_real *att,
                                const moe_real *dout, int num_seqs, int seq_len, int num_heads, int num_kv_heads,
                                int head_dim, moe_real *dq, moe_real *dk, moe_real *dv, moe_real *scratch);

/* CUDA (float, device pointers, queued on gpu's stream, no host sync): the shapes and contracts of the CPU
 * versions; GEMMs in fp32 through cuBLAS with the context's math mode (no TF32). num_kv_heads must divide
 * num_heads (MOE_ERR_INVALID_ARG otherwise). backward uses gpu's scratch for dS: num_seqs * H * S * S floats,
 * as big as att; dk and dv add their group's query heads in increasing head order (no atomics). */
moe_status moe_attention_forward_cuda(moe_gpu *gpu, const float *q, const float *k, const float *v, int num_seqs,
                                      int seq_len, int num_heads, int num_kv_heads, int head_dim, float *att,
                                      float *out);
moe_status moe_attention_backward_cuda(moe_gpu *gpu, const float *q, const float *k, const float *v, const float *att,
                                       const float *dout, int num_seqs, int seq_len, int num_heads, int num_kv_heads,
                                       int head_dim, float *dq, float *dk, float *dv);

/* Fused attention: the same function in tiles of MOE_ATTENTION_TILE query rows and keys with an online softmax
 * (kernels/attention_fused_cpu.c gives the formulas), no [S, S] matrix kept: forward writes out and lse
 * [num_seqs, H, S] (each row's log-sum-exp of its scaled scores, what backward recomputes the probabilities from);
 * backward takes out too, and overwrites dq, dk, dv (dk and dv summed over a kv head's query heads in increasing
 * head order, no atomics). Key tiles after a query tile are skipped. CPU scratch: moe_threads_get() *
 * moe_attention_fused_scratch_count(hd) reals (one part per thread). CUDA: no scratch beyond gpu's own; queued on
 * gpu's stream, no host sync; the same contracts.
 *
 * bf16 (core/precision.h, MOE_GEMM_ATTENTION): the products take bf16 inputs, rounded at the points where
 * FlashAttention-2's tensor-core kernels round them: q, k, v (and dout in backward) as they are read, the
 * probabilities P before P v (forward: the row sums l keep the unrounded P) and before dV = P^T dout, and
 * dS = P (dP - D) scale before dQ = dS k and dK = dS^T q, where D = dout . out takes dout rounded too (so that
 * sum_j P_ij (dP_ij - D_i) stays ~0 as in fp32: a one-key row's dq and dk stay rounding noise). Scores, the online
 * softmax, lse and every accumulation stay fp32. On CUDA the tensor-core kernels (kernels/attention_flash.cu) run
 * under bf16 where they apply (moe_attention_flash_applies), the plain kernels round at the same points elsewhere. */
enum { MOE_ATTENTION_TILE = 64 };
size_t moe_attention_fused_scratch_count(int head_dim);
void moe_attention_fused_forward_cpu(const moe_real *q, const moe_real *k, const moe_real *v, int num_seqs, int seq_len,
                                     int num_heads, int num_kv_heads, int head_dim, int bf16, moe_real *lse,
                                     moe_real *out, moe_real *scratch);
void moe_attention_fused_backward_cpu(const moe_real *q, const moe_real *k, const moe_real *v, const moe_real *out,
                                      const moe_real *lse, const moe_real *dout, int num_seqs, int seq_len,
                                      int num_heads, int num_kv_heads, int head_dim, int bf16, moe_real *dq,
                                      moe_real *dk, moe_real *dv, moe_real *scratch);
moe_status moe_attention_fused_forward_cuda(moe_gpu *gpu, const float *q, const float *k, const float *v, int num_seqs,
                                            int seq_len, int num_heads, int num_kv_heads, int head_dim, int bf16,
                                            float *lse, float *out);
moe_status moe_attention_fused_backward_cuda(moe_gpu *gpu, const float *q, const float *k, const float *v,
                                             const float *out, const float *lse, const float *dout, int num_seqs,
                                             int seq_len, int num_heads, int num_kv_heads, int head_dim, int bf16,
                                             float *dq, float *dk, float *dv);

/* Whether the tensor-core flash kernels (kernels/attention_flash.cu: bf16 mma.sync, sm_80 and later, as every GPU
 * the build targets) run a bf16 fused attention of head_dim: head_dim 32, 64 or 128 (the instantiated tile plans of
 * kernels/flash_tiles.h); never with MOE_FLASH_ATTENTION=0 in the environment (the plain kernels, for a diagnosis).
 * Decided by the shape alone, so that a step's bits never depend on where its buffers lie: the flash kernels refuse
 * buffers that are not 16-byte aligned (MOE_ERR_INVALID_ARG; rows of whole heads always are) rather than run the
 * plain ones, which add in another order (until 2026-12-07 they did). Host code, no device call. */
int moe_attention_flash_applies(int head_dim);

#endif
