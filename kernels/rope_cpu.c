/* rope_cpu.c — rotary position embedding, rotate-half convention (formulas: rope.h). Angles p * f_i and
 * their cos/sin are computed in double, then cast, so the float build loses nothing at large positions.
 * The backward rotates by -p f_i: it is the transpose (and inverse) of the forward.
 * Tested in tests/test_model_kernels.c: <rope(x), y> = <x, rope_backward(y)>, position 0 is the identity,
 * and a hand-computed rotation. */
#include "kernels/rope.h"

#include <math.h>

#include "core/threads.h"

/* sign = +1: forward; -1: backward. One cos/sin per (position, frequency), reused by every sequence
 * and head. Positions are split over the threads (each rotates its own rows); a row's heads are rotated with
 * the position's cos/sin in a table, frequency innermost, so that the loop runs on contiguous values (vectors). */
static void rope_rotate(moe_real *x, int num_seqs, int seq_len, int num_heads, int head_dim, double theta,
                        double sign) {
    enum { MAX_HALF = 512 }; /* frequencies per table (on the stack): a larger head_dim takes several rounds */
    const int half = head_dim / 2;
    const size_t row = (size_t)num_heads * head_dim;
#pragma omp parallel for schedule(static) if ((size_t)num_seqs * seq_len * row >= MOE__PAR_MIN_ELEMS)
    for (int p = 0; p < seq_len; p++)
        for (int i0 = 0; i0 < half; i0 += MAX_HALF) {
            const int count = half - i0 < MAX_HALF ? half - i0 : MAX_HALF;
            moe_real c[MAX_HALF], s[MAX_HALF];
            for (int i = 0; i < count; i++) {
                const double angle = p * pow(theta, -2.0 * (i0 + i) / head_dim);
                c[i] = (moe_real)cos(angle), s[i] = (moe_real)(sign * sin(angle));
            }
            for (int n = 0; n < num_seqs; n++) {
                moe_real *xr = x + ((size_t)n * seq_len + p) * row;
                for (int h = 0; h < num_heads; h++) {
                    moe_real *a = xr + (size_t)h * head_dim + i0, *b = a + half;
                    for (int i = 0; i < count; i++) {
                        const moe_real a0 = a[i], b0 = b[i];
                        a[i] = a0 * c[i] - b0 * s[i];
                        b[i] = b0 * c[i] + a0 * s[i];
                    }
                }
            }
        }
}

void moe_rope_forward_cpu(moe_real *x, int num_seqs, int seq_len, int num_heads, int head_dim, double theta) {
    rope_rotate(x, num_seqs, seq_len, num_heads, head_dim, theta, 1);
}

void moe_rope_backward_cpu(moe_real *dx, int num_seqs, int seq_len, int num_heads, int head_dim, double theta) {
    rope_rotate(dx, num_seqs, seq_len, num_heads, head_dim, theta, -1);
}
