/* rope.h — rotary position embedding, Hugging Face's rotate-half convention. CPU and CUDA.
 * For a head vector h of size hd (even) at position p and i < hd/2, with frequencies f_i (moe_rope_frequency) and
 * amplitude a (1 but with YaRN):
 *   h'[i]        = a (h[i] cos(p f_i) - h[i + hd/2] sin(p f_i))
 *   h'[i + hd/2] = a (h[i + hd/2] cos(p f_i) + h[i] sin(p f_i))
 * Rows are [num_seqs * seq_len] tokens, sequence-major; position p = token index within its sequence. */
#ifndef MOE_KERNELS_ROPE_H
#define MOE_KERNELS_ROPE_H

#include <math.h>

#include "core/gpu.h"
#include "core/types.h"

#ifdef __CUDACC__
#define MOE_ROPE_FN __host__ __device__ static inline
#else
#define MOE_ROPE_FN static inline
#endif

/* RoPE's frequencies. Plain (yarn_factor 0): f_i = e_i = theta^(-2i/hd), amplitude 1. YaRN (Peng et al. 2023;
 * transformers' rope type "yarn", as its _compute_yarn_parameters computes it; yarn_factor s >= 1): the frequencies
 * that turn fewer than beta_slow times over the original context P are interpolated (e_i / s), those that turn more
 * than beta_fast times kept, a linear ramp between:
 *   f_i = e_i / s r_i + e_i (1 - r_i),  r_i = clamp((i - lo) / (hi - lo), 0, 1),
 *   lo = max(floor(c(beta_fast)), 0), hi = min(ceil(c(beta_slow)), hd - 1) (+ 0.001 where equal),
 *   c(b) = hd ln(P / (2 pi b)) / (2 ln theta), the index whose frequency turns b times over P;
 * and cos and sin times `amplitude` (transformers' attention_factor; the model derives it: moe_model_rope). */
typedef struct {
    double theta;
    double yarn_factor;        /* s; 0: plain RoPE                 */
    double original_positions; /* P, the context pretrained on     */
    double beta_fast, beta_slow;
    double amplitude;          /* 1 for plain RoPE                 */
} moe_rope;

MOE_ROPE_FN moe_rope moe_rope_plain(double theta) {
    const moe_rope r = {theta, 0, 0, 0, 0, 1};
    return r;
}

MOE_ROPE_FN double moe_rope_frequency(const moe_rope *r, int i, int head_dim) {
    const double e = pow(r->theta, -2.0 * i / head_dim);
    if (!(r->yarn_factor > 0)) return e;
    const double two_pi = 6.283185307179586, two_log_theta = 2 * log(r->theta);
    double lo = floor(head_dim * log(r->original_positions / (two_pi * r->beta_fast)) / two_log_theta);
    double hi = ceil(head_dim * log(r->original_positions / (two_pi * r->beta_slow)) / two_log_theta);
    lo = lo > 0 ? lo : 0, hi = hi < head_dim - 1 ? hi : head_dim - 1;
    if (lo == hi) hi += 0.001;
    double ramp = (i - lo) / (hi - lo);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    return e / r->yarn_factor * ramp + e * (1 - ramp);
}

/* x: [num_seqs * seq_len, num_heads, head_dim], rotated in place. */
void moe_rope_forward_cpu(moe_real *x, int num_seqs, int seq_len, int num_heads, int head_dim, const moe_rope *rope);

/* The backward of the rotation (its transpose: a times the rotation by -p f_i), in place on dx. */
void moe_rope_backward_cpu(moe_real *dx, int num_seqs, int seq_len, int num_heads, int head_dim, const moe_rope *rope);

/* The same rotations with the cos/sin of every (position, frequency) from a table the caller keeps:
 * table[p * head_dim + i] = a cos(p f_i), table[p * head_dim + head_dim / 2 + i] = a sin(p f_i), i < head_dim / 2
 * (moe_rope_table_count values, filled by moe_rope_table_cpu). The same bits as the functions above. */
size_t moe_rope_table_count(int seq_len, int head_dim);
void moe_rope_table_cpu(int seq_len, int head_dim, const moe_rope *rope, moe_real *table);
void moe_rope_rotate_cpu(moe_real *x, int num_seqs, int seq_len, int num_heads, int head_dim, const moe_real *table,
                         int backward);

/* CUDA (float, device pointer, in place, queued on gpu's stream, no host sync). The cos/sin table
 * [seq_len, head_dim / 2] is computed in double and cast, as on the CPU, into gpu's scratch. head_dim must be
 * even (MOE_ERR_INVALID_ARG otherwise). */
moe_status moe_rope_forward_cuda(moe_gpu *gpu, float *x, int num_seqs, int seq_len, int num_heads, int head_dim,
                                 const moe_rope *rope);
moe_status moe_rope_backward_cuda(moe_gpu *gpu, float *dx, int num_seqs, int seq_len, int num_heads, int head_dim,
                                  const moe_rope *rope);

#endif
