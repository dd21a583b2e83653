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

#endif
