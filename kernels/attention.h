/* attention.h — causal multi-head self-attention with grouped-query heads (GQA). CPU, cblas GEMMs.
 * q: [num_seqs * S, H, hd]; k, v: [num_seqs * S, KV, hd], KV divides H; query head h reads kv head
 * h / (H / KV) (Hugging Face's repeat_kv). Per sequence and head:
 *   P = softmax(q k^T / sqrt(hd) + causal mask)  [S, S],  out = P v  [S, hd]
 * Every sequence is computed on its own, so results do not depend on which sequences share a call. */
#ifndef MOE_KERNELS_ATTENTION_H
#define MOE_KERNELS_ATTENTION_H

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

#endif
