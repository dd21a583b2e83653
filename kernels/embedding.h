/* embedding.h — token embedding lookup and its gradient. CPU.
 *   y[t, :] = table[token_t, :] */
#ifndef MOE_KERNELS_EMBEDDING_H
#define MOE_KERNELS_EMBEDDING_H

#include "core/types.h"

void moe_embedding_forward_cpu(const moe_real *table, const int *tokens, int num_tokens, int d, moe_real *y);

/* dtable[token_t, :] += dy[t, :], in token order t = 0, 1, ... (a fixed order: deterministic). */
void moe_embedding_backward_cpu(const moe_real *dy, const int *tokens, int num_tokens, int d, moe_real *dtable);

#endif
