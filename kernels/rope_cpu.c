/* rope_cpu.c — rotary position embedding, rotate-half convention (formulas: rope.h). Angles p * f_i and
 * their cos/sin are computed in double, then cast, so the float build loses nothing at large positions.
 * The backward rotates by -p f_i: it is the transpose (and, with amplitude 1, the inverse) of the forward. The cos/sin
 * of every (position, frequency) come from a table a caller keeps (moe_rope_table_cpu: the dense ops keep one per
 * shape, so a step does not recompute them for every layer and pass) or are computed per call; the same bits either
 * way.
 * Tested in tests/test_model_kernels.c: <rope(x), y> = <x, rope_backward(y)>, position 0 is the identity,
 * and a hand-computed rotation. */
#include "kernels/rope.h"

#include <math.h>

#include "core/threads.h"

/* Position p's rows of x rotated by the angles whose cos and sin are c[0..count), s[0..count) (frequencies i0 ..
 * i0 + count): by +p f_i forward; by -p f_i backward, a' = a c + b s, b' = b c - a s (the negated sine's bits). A row's
 * heads are rotated with the same values, frequency innermost, so that the loop runs on contiguous values (vectors). */
static void rotate_position(moe_real *x, int p, int num_seqs, int seq_len, int num_heads, int head_dim, int i0,
                            int count, const moe_real *c, const moe_real *s, int backward) {
    const int half = head_dim / 2;
    const size_t row = (size_t)num_heads * head_dim;
    for (int n = 0; n < num_seqs; n++) {
        moe_real *xr = x + ((size_t)n * seq_len + p) * row;
        for (int h = 0; h < num_heads; h++) {
            moe_real *a = xr + (size_t)h * head_dim + i0, *b = a + half;
            if (backward)
                for (int i = 0; i < count; i++) {
                    const moe_real a0 = a[i], b0 = b[i];
                    a[i] = a0 * c[i] + b0 * s[i];
                    b[i] = b0 * c[i] - a0 * s[i];
                }
            else
                for (int i = 0; i < count; i++) {
                    const moe_real a0 = a[i], b0 = b[i];
                    a[i] = a0 * c[i] - b0 * s[i];
                    b[i] = b0 * c[i] + a0 * s[i];
                }
        }
    }
}

/* a cos and a sin of p f_i for frequencies i0 .. i0 + count (a = 1: the plain cos and sin's bits) */
static void angles(int p, int i0, int count, int head_dim, const moe_rope *rope, moe_real *c, moe_real *s) {
    for (int i = 0; i < count; i++) {
        const double angle = p * moe_rope_frequency(rope, i0 + i, head_dim);
        c[i] = (moe_real)(rope->amplitude * cos(angle)), s[i] = (moe_real)(rope->amplitude * sin(angle));
    }
}

size_t moe_rope_table_count(int seq_len, int head_dim) { return (size_t)seq_len * head_dim; }

void moe_rope_table_cpu(int seq_len, int head_dim, const moe_rope *rope, moe_real *table) {
    const int half = head_dim / 2;
    MOE__PARALLEL_FOR((size_t)seq_len * half >= MOE__PAR_MIN_ELEMS,
    for (int p = 0; p < seq_len; p++)
        angles(p, 0, half, head_dim, rope, table + (size_t)p * head_dim, table + (size_t)p * head_dim + half));
}

void moe_rope_rotate_cpu(moe_real *x, int num_seqs, int seq_len, int num_heads, int head_dim, const moe_real *table,
                         int backward) {
    const int half = head_dim / 2;
    MOE__PARALLEL_FOR((size_t)num_seqs * seq_len * num_heads * head_dim >= MOE__PAR_MIN_ELEMS,
    for (int p = 0; p < seq_len; p++) {
        const moe_real *c = table + (size_t)p * head_dim;
        rotate_position(x, p, num_seqs, seq_len, num_heads, head_dim, 0, half, c, c + half, backward);
    });
}

/* Without a table: each position's cos/sin on the stack, in rounds of MAX_HALF frequencies. Positions are split over
 * the threads (each rotates its own rows). */
static void rope_rotate(moe_real *x, int num_seqs, int seq_len, int num_heads, int head_dim, const moe_rope *rope,
                        int backward) {
    enum { MAX_HALF = 512 };
    const int half = head_dim / 2;
    MOE__PARALLEL_FOR((size_t)num_seqs * seq_len * num_heads * head_dim >= MOE__PAR_MIN_ELEMS,
    for (int p = 0; p < seq_len; p++)
        for (int i0 = 0; i0 < half; i0 += MAX_HALF) {
            const int count = half - i0 < MAX_HALF ? half - i0 : MAX_HALF;
            moe_real c[MAX_HALF], s[MAX_HALF];
            angles(p, i0, count, head_dim, rope, c, s);
            rotate_position(x, p, num_seqs, seq_len, num_heads, head_dim, i0, count, c, s, backward);
        });
}

void moe_rope_forward_cpu(moe_real *x, int num_seqs, int seq_len, int num_heads, int head_dim, const moe_rope *rope) {
    rope_rotate(x, num_seqs, seq_len, num_heads, head_dim, rope, 0);
}

void moe_rope_backward_cpu(moe_real *dx, int num_seqs, int seq_len, int num_heads, int head_dim, const moe_rope *rope) {
    rope_rotate(dx, num_seqs, seq_len, num_heads, head_dim, rope, 1);
}
