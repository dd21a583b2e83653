/* permute.h — moving token rows to and from the expert-major order of the dispatch layout. CPU.
 * d = row width; slot[t*k + j] is token t's j-th assignment's row (or -1 when dropped). */
#ifndef MOE_KERNELS_PERMUTE_H
#define MOE_KERNELS_PERMUTE_H

#include "moe/moe.h"

/* xp[r, :] = x[perm_token[r], :] for r < num_rows (a gather). */
void permute_rows_cpu(const moe_real *x, const int *perm_token, int num_rows, int d, moe_real *xp);

/* out[t, :] = sum over j = 0..k-1, in that order, of gate[t*k+j] * y[slot[t*k+j], :] (kept ones only);
 * gate == NULL means unit gates, which makes this the backward of permute_rows_cpu. No atomics: each
 * output row is written by one loop in a fixed order, so the result is bitwise reproducible. */
void combine_rows_cpu(const moe_real *y, const int *slot, const moe_real *gate, int num_tokens, int top_k,
                      int d, moe_real *out);

/* Backward of combine_rows_cpu with gates: dy[slot, :] = gate * dout[t, :] for kept assignments and
 * dgate[t*k+j] = <dout[t, :], y[slot, :]> (0 when dropped: a dropped assignment contributes nothing). */
void combine_rows_backward_cpu(const moe_real *dout, const moe_real *y, const int *slot, const moe_real *gate,
                               int num_tokens, int top_k, int d, moe_real *dy, moe_real *dgate);

#endif
