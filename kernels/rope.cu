/* rope.cu — rotary position embedding in place on the GPU (formulas: rope.h; the CPU twin: rope_cpu.c).
 * rope_table computes, once per (position p, frequency i), angle = p f_i (moe_rope_frequency) and its cos and sin
 * in double, times the amplitude, cast to float, exactly as the CPU does; rope_rotate then rotates every (token,
 * head, i) pair with them. The rotation uses __fmul_rn / __fsub_rn / __fadd_rn (never contracted into an FMA, like
 * the CPU build), so the outputs differ from the CPU's only where CUDA's double pow/cos/sin (<= 2 ulp in double)
 * round to another float than glibc's.
 * Checked by tests/test_gpu_dense_ops_b.cu (build: ninja -C build; run: meson test -C build --suite gpu). */
#include "core/gpu_cuda.h"

extern "C" {
#include "kernels/rope.h"
}

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

/* cs[2 (p half + i)] = a cos(angle), cs[2 (p half + i) + 1] = sign a sin(angle); sign -1 is the backward */
__global__ void rope_table(int seq_len, int head_dim, moe_rope rope, double sign, float2 *cs) {
    const int half = head_dim / 2;
    const size_t count = (size_t)seq_len * half;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < count; idx += stride) {
        const int p = (int)(idx / half), i = (int)(idx % half);
        const double angle = p * moe_rope_frequency(&rope, i, head_dim);
        cs[idx] = make_float2((float)(rope.amplitude * cos(angle)), (float)(sign * (rope.amplitude * sin(angle))));
    }
}

/* x [num_seqs * seq_len, num_heads, head_dim]: a' = a c - b s, b' = b c + a s for the pair (i, i + half) */
__global__ void rope_rotate(float *x, size_t num_rows, int seq_len, int num_heads, int head_dim, const float2 *cs) {
    const int half = head_dim / 2;
    const size_t count = num_rows * num_heads * half;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < count; idx += stride) {
        const int i = (int)(idx % half);
        const size_t row_head = idx / half, row = row_head / num_heads;
        const int p = (int)(row % seq_len);
        float *a = x + row_head * head_dim + i, *b = a + half;
        const float2 r = cs[(size_t)p * half + i];
        const float a0 = *a, b0 = *b;
        *a = __fsub_rn(__fmul_rn(a0, r.x), __fmul_rn(b0, r.y));
        *b = __fadd_rn(__fmul_rn(b0, r.x), __fmul_rn(a0, r.y));
    }
}

unsigned blocks_for(size_t count) {
    const size_t b = (count + kThreads - 1) / kThreads;
    return (unsigned)(b > (size_t)kMaxBlocks ? kMaxBlocks : b);
}

moe_status rope(moe_gpu *gpu, float *x, int num_seqs, int seq_len, int num_heads, int head_dim, const moe_rope *r,
                double sign) {
    if (num_seqs < 0 || seq_len < 0 || num_heads < 0 || head_dim < 0 || head_dim % 2 || !x || !r)
        return MOE_ERR_INVALID_ARG;
    const size_t pairs = (size_t)seq_len * (head_dim / 2);
    if (num_seqs == 0 || num_heads == 0 || pairs == 0) return MOE_OK;
    void *scratch = NULL; /* the table: [seq_len, head_dim / 2] float2 */
    moe_status st = moe_gpu_scratch(gpu, pairs * sizeof(float2), &scratch);
    if (st != MOE_OK) return st;
    float2 *cs = (float2 *)scratch;
    rope_table<<<blocks_for(pairs), kThreads, 0, gpu->stream>>>(seq_len, head_dim, *r, sign, cs);
    MOE_CUDA_LAUNCHED();
    const size_t num_rows = (size_t)num_seqs * seq_len;
    rope_rotate<<<blocks_for(num_rows * num_heads * (head_dim / 2)), kThreads, 0, gpu->stream>>>(
        x, num_rows, seq_len, num_heads, head_dim, cs);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

} // namespace

extern "C" moe_status moe_rope_forward_cuda(moe_gpu *gpu, float *x, int num_seqs, int seq_len, int num_heads,
                                            int head_dim, const moe_rope *r) {
    return rope(gpu, x, num_seqs, seq_len, num_heads, head_dim, r, 1);
}

extern "C" moe_status moe_rope_backward_cuda(moe_gpu *gpu, float *dx, int num_seqs, int seq_len, int num_heads,
                                             int head_dim, const moe_rope *r) {
    return rope(gpu, dx, num_seqs, seq_len, num_heads, head_dim, r, -1);
}
