/* embedding.h — token embedding lookup and its gradient. CPU and CUDA.
 *   y[t, :] = table[token_t, :]
 * The _range versions take a table that holds the rows of token ids [first, first + rows) only (a vocabulary-parallel
 * embedding's block, models/model.h): a token outside gives a row of -0.0 (x + -0.0 is x, bits and sign, for every x:
 * the group's sum of such rows is exact) and adds nothing to dtable. */
#ifndef MOE_KERNELS_EMBEDDING_H
#define MOE_KERNELS_EMBEDDING_H

#include "core/gpu.h"
#include "core/types.h"

void moe_embedding_forward_cpu(const moe_real *table, const int *tokens, int num_tokens, int d, moe_real *y);
void moe_embedding_forward_range_cpu(const moe_real *table, const int *tokens, int num_tokens, int d, int first,
                                     int rows, moe_real *y);

/* dtable[token_t, :] += dy[t, :], in token order t = 0, 1, ... (a fixed order: deterministic). */
void moe_embedding_backward_cpu(const moe_real *dy, const int *tokens, int num_tokens, int d, moe_real *dtable);
void moe_embedding_backward_range_cpu(const moe_real *dy, const int *tokens, int num_tokens, int d, int first, int rows,
                                      moe_real *dtable);

/* CUDA (kernels/embedding.cu): device pointers, queued on gpu's stream, no host sync. The backward sorts the
 * token ids stably and adds each token's rows in token order, the CPU's order: the CPU's bits, no atomics.
 * It uses the context's scratch (moe_gpu_scratch). */
moe_status moe_embedding_forward_cuda(moe_gpu *gpu, const float *table, const int *tokens, int num_tokens, int d,
                                      float *y);
moe_status moe_embedding_backward_cuda(moe_gpu *gpu, const float *dy, const int *tokens, int num_tokens, int d,
                                       float *dtable);
moe_status moe_embedding_forward_range_cuda(moe_gpu *gpu, const float *table, const int *tokens, int num_tokens, int d,
                                            int first, int rows, float *y);
moe_status moe_embedding_backward_range_cuda(moe_gpu *gpu, const float *dy, const int *tokens, int num_tokens, int d,
                                             int first, int rows, float *dtable);

#endif
