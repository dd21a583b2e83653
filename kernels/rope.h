/* rope.h — rotary position embedding, Hugging Face's rotate-half convention. CPU and CUDA.
 * For a head vector h of size hd (even) at position p and i < hd/2, with f_i = theta^(-2i/hd):
 *   h'[i]        = h[i] cos(p f_i) - h[i + hd/2] sin(p f_i)
 *   h'[i + hd/2] = h[i + hd/2] cos(p f_i) + h[i] sin(p f_i)
 * Rows are [num_seqs * seq_len] tokens, sequence-major; position p = token index within its sequence. */
#ifndef MOE_KERNELS_ROPE_H
#define MOE_KERNELS_ROPE_H

#include "core/gpu.h"
#include "core/types.h"

/* x: [num_seqs * seq_len, num_heads, head_dim], rotated in place. */
void moe_rope_forward_cpu(moe_real *x, int num_seqs, int seq_len, int num_heads, int head_dim, double theta);

/* The backward of the rotation (rotation by -p f_i), in place on dx. */
void moe_rope_backward_cpu(moe_real *dx, int num_seqs, int seq_len, int num_heads, int head_dim, double theta);

/* The same rotations with the cos/sin of every (position, frequency) from a table the caller keeps:
 * table[p * head_dim + i] = cos(p f_i), table[p * head_dim + head_dim / 2 + i] = sin(p f_i), i < head_dim / 2
 * (moe_rope_table_count values, filled by moe_rope_table_cpu). The same bits as the functions above. */
size_t moe_rope_table_count(int seq_len, int head_dim);
void moe_rope_table_cpu(int seq_len, int head_dim, double theta, moe_real *table);
void moe_rope_rotate_cpu(moe_real *x, int num_seqs, int seq_len, int num_heads, int head_dim, const moe_real *table,
                         int backward);

/* CUDA (float, device pointer, in place, queued on gpu's stream, no host sync). The cos/sin table
 * [seq_len, head_dim / 2] is computed in double and cast, as on the CPU, into gpu's scratch. head_dim must be
 * even (MOE_ERR_INVALID_ARG otherwise). */
moe_status moe_rope_forward_cuda(moe_gpu *gpu, float *x, int num_seqs, int seq_len, int num_heads, int head_dim,
                                 double theta);
moe_status moe_rope_backward_cuda(moe_gpu *gpu, float *dx, int num_seqs, int seq_len, int num_heads, int head_dim,
                                  double theta);

#endif
