/* attention_gemms.h — internal: the GEMMs of the CUDA attention (kernels/attention.cu) as data, so that the list
 * cuBLAS runs can also run on the CPU: tests/test_attention_gemms.c executes it with column-major cblas calls
 * around the two softmax steps and compares with the CPU attention, which checks every transpose, leading
 * dimension, offset and stride of the GPU's products on a machine without a GPU.
 *
 * Each entry is a product of sequence 0, column-major as cuBLAS means it (a row-major M [r, c] with leading dimension
 * L is the column-major M^T [c, r] with the same L), run for sequence n at the offsets plus n times the strides: on
 * cuBLAS one call per sequence (kernels/attention.cu says why). */
#ifndef MOE_KERNELS_ATTENTION_GEMMS_H
#define MOE_KERNELS_ATTENTION_GEMMS_H

#include <stddef.h>

/* The arrays a product reads or writes (attention.h's shapes; P is att, dS the backward's scratch of its shape). */
typedef enum {
    MOE__ATT_Q, MOE__ATT_K, MOE__ATT_V, MOE__ATT_P, MOE__ATT_DOUT, MOE__ATT_DS, MOE__ATT_OUT, MOE__ATT_DQ,
    MOE__ATT_DK, MOE__ATT_DV, MOE__ATT_ARRAYS
} moe__att_array;

typedef struct {
    int trans_a, trans_b, m, n, k;          /* C[m, n] = alpha op(A) op(B) + beta C, column-major */
    float alpha, beta;
    moe__att_array a, b, c;
    size_t a_off, b_off, c_off;             /* floats into the array, for sequence 0 */
    int lda, ldb, ldc;
    long long stride_a, stride_b, stride_c; /* floats from one sequence to the next */
} moe__att_gemm;

typedef enum {
    MOE__ATT_SCORES,   /* forward, before the softmax: scores^T = scale K Q^T, per query head */
    MOE__ATT_OUTPUT,   /* forward, after it: out^T = V^T P^T */
    MOE__ATT_DV_DP,    /* backward, before the softmax's backward: dV^T += dO^T P, then dP^T = V dO^T, per head */
    MOE__ATT_DQ_DK,    /* backward, after it: dQ^T = K^T dS^T, then dK^T += Q^T dS, per head */
} moe__att_phase;

/* The products of a phase, in the order they must run (dK and dV add a group's query heads in increasing head
 * order), into out, which has room for 2 * num_heads; returns how many. */
int moe__attention_gemms(moe__att_phase phase, int seq_len, int num_heads, int num_kv_heads, int head_dim,
                         moe__att_gemm *out);

#endif
