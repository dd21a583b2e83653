/* rope_cpu.c — rotary position embedding, rotate-half convention (formulas: rope.h). Angles p * f_i and
 * their cos/sin are computed in double, then cast, so the float build loses nothing at large positions.
 * The backward rotates by -p f_i: it is the transpose (and inverse) of the forward.
 * Tested in tests/test_model_kernels.c: <rope(x), y> = <x, rope_backward(y)>, position 0 is the identity,
 * and a hand-computed rotation. */
#include "kernels/rope.h"

#include <math.h>

#include "core/threads.h"

/* sign = +1: forward; -1: backward. One cos/sin per (position, frequency), reused by every sequence
 * and head. Positions are split over the threads (each rotates its own rows). */
static void rope_rotate(moe_real *x, int num_seqs, int seq_len, int num_heads, int head_dim, double theta,
                        double sign) {
    const int half = head_dim / 2;
    const size_t row = (size_t)num_heads * head_dim;
#pragma omp parallel for schedule(static) if ((size_t)num_seqs * seq_len * row >= MOE__PAR_MIN_ELEMS)
    for (int p = 0; p < seq_len; p++)
        for (int i = 0; i < half; i++) {
            double angle = p * pow(theta, -2.0 * i / head_dim);
            moe_real c = (moe_real)cos(angle), s = (moe_real)(sign * sin(angle));
            for (int n = 0; n < num_seqs; n++) {
                moe_real *xr = x + ((size_t)n * seq_len + p) * row;
                for (int h = 0; h < num_heads; h++) {
                    moe_real *a = xr + (size_t)h * head_dim + i, *b = a + half;
                    moe_real a0 = *a, b0 = *b;
                    *a = a0 * c - b0 * s;
                    *b = b0 * c + a0 * s;
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
