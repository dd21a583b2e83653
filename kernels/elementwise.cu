/* elementwise.cu — y = a + b, a *= factor, the sum of squares, the fp32 SwiGLU, a bias add and a sigmoid row gate on
 * the GPU (elementwise.h): the
 * bits of the dense table's CPU entries (moe/dense_ops_cpu.c), and for the SwiGLU the CPU's operations in its order. Products and sums are written as __fadd_rn / __dmul_rn /
 * __dadd_rn so that nvcc cannot contract them into FMAs the CPU does not do.
 *
 * The sums of squares: one block of MOE__SUM_LANES threads per range, all ranges in one launch; thread j adds the
 * squares of the range's values j, j + LANES, ... (coalesced loads), then the block adds the lanes in the fixed
 * pairwise tree the CPU uses (core/threads.h): the CPU's bits, with no serial chain, and one download of every
 * range's sum. Checked against the CPU table by tests/test_gpu_dense_table.c (suite gpu). */
#include "core/gpu_cuda.h"

extern "C" {
#include "core/threads.h"
#include "kernels/elementwise.h"
}

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

int blocks_for(size_t n) {
    size_t b = (n + kThreads - 1) / kThreads;
    return b > (size_t)kMaxBlocks ? kMaxBlocks : (int)b;
}

__global__ void add_kernel(const float *a, const float *b, size_t n, float *y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(a[i], b[i]);
}

__global__ void scale_kernel(float *a, size_t n, double factor) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        a[i] = __double2float_rn(__dmul_rn((double)a[i], factor));
}

/* s = 1 / (1 + e^-h), as experts/expert_ffn_cpu.c's sigmoid */
__device__ float sigmoid(float h) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-h))); }

__global__ void swiglu_forward_kernel(const float *h1, const float *h3, size_t n, float *act) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        act[i] = __fmul_rn(__fmul_rn(h1[i], sigmoid(h1[i])), h3[i]);
}

/* dH3 = (dA h1) s;  dH1 = ((dA h3) s) (1 + h1 (1 - s)), each product and sum rounded once, the CPU's order */
__global__ void swiglu_backward_kernel(const float *h1, const float *h3, size_t n, float *dh1, float *dh3) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float h = h1[i], s = sigmoid(h), dA = dh1[i];
        dh3[i] = __fmul_rn(__fmul_rn(dA, h), s);
        dh1[i] = __fmul_rn(__fmul_rn(__fmul_rn(dA, h3[i]), s), __fadd_rn(1.0f, __fmul_rn(h, __fsub_rn(1.0f, s))));
    }
}

__global__ void bias_add_kernel(float *x, const float *b, size_t rows, int n) {
    const size_t total = rows * (size_t)n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], b[i % n]);
}

__global__ void gate_rows_forward_kernel(const float *g, const float *y, size_t rows, int d, float *out) {
    const size_t total = rows * (size_t)d;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(out[i], __fmul_rn(sigmoid(g[i / d]), y[i]));
}

/* one thread per row: the dot product in double in index order, as the CPU's loop */
__global__ void gate_rows_backward_kernel(const float *g, const float *y, const float *dout, size_t rows, int d,
                                          float *dy, float *dg) {
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < rows; t += (size_t)gridDim.x * blockDim.x) {
        const float gate = sigmoid(g[t]);
        double dot = 0;
        for (int i = 0; i < d; i++) {
            const size_t at = t * d + i;
            dot = __dadd_rn(dot, __dmul_rn((double)dout[at], (double)y[at]));
            dy[at] = __fmul_rn(gate, dout[at]);
        }
        dg[t] = __double2float_rn(__dmul_rn(__dmul_rn(dot, (double)gate), (double)__fsub_rn(1.0f, gate)));
    }
}

/* grid = one block of MOE__SUM_LANES threads per range: sums[r] = range r's sum of squares, its lanes added in the
 * tree (a square of a float is exact in double, so the product is the CPU's whatever the compiler fuses). */
__global__ void sum_squares_ranges(const float *a, const size_t *bounds, double *sums) {
    __shared__ double lane[MOE__SUM_LANES];
    const size_t lo = bounds[blockIdx.x], hi = bounds[blockIdx.x + 1];
    const int j = threadIdx.x;
    double t = 0;
    for (size_t i = lo + j; i < hi; i += MOE__SUM_LANES) t = __dadd_rn(t, __dmul_rn((double)a[i], (double)a[i]));
    lane[j] = t;
    for (int h = MOE__SUM_LANES / 2; h > 0; h /= 2) {
        __syncthreads();
        if (j < h) lane[j] = __dadd_rn(lane[j], lane[j + h]);
    }
    if (j == 0) sums[blockIdx.x] = lane[0];
}

} // namespace

extern "C" moe_status moe_add_cuda(moe_gpu *gpu, const float *a, const float *b, size_t n, float *y) {
    if (n == 0) return MOE_OK;
    if (!a || !b || !y) return MOE_ERR_INVALID_ARG;
    add_kernel<<<blocks_for(n), kThreads, 0, gpu->stream>>>(a, b, n, y);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_scale_cuda(moe_gpu *gpu, float *a, size_t n, double factor) {
    if (n == 0) return MOE_OK;
    if (!a) return MOE_ERR_INVALID_ARG;
    scale_kernel<<<blocks_for(n), kThreads, 0, gpu->stream>>>(a, n, factor);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_sum_squares_cuda(moe_gpu *gpu, const float *a, const size_t *bounds, size_t count,
                                          double *sums) {
    if (count == 0) return MOE_OK;
    if (!bounds || !sums || (bounds[count] > bounds[0] && !a)) return MOE_ERR_INVALID_ARG;
    if (count > 0x7fffffffu) return MOE_ERR_INVALID_ARG; /* one block per range */
    void *scratch = NULL; /* the sums [count] double, then the bounds [count + 1] */
    MOE_TRY(moe_gpu_scratch(gpu, count * sizeof(double) + (count + 1) * sizeof(size_t), &scratch));
    double *d_sums = (double *)scratch;
    size_t *d_bounds = (size_t *)(d_sums + count);
    MOE_CUDA_TRY(cudaMemcpyAsync(d_bounds, bounds, (count + 1) * sizeof(size_t), cudaMemcpyHostToDevice, gpu->stream));
    sum_squares_ranges<<<(unsigned)count, MOE__SUM_LANES, 0, gpu->stream>>>(a, d_bounds, d_sums);
    MOE_CUDA_LAUNCHED();
    MOE_CUDA_TRY(cudaMemcpyAsync(sums, d_sums, count * sizeof(double), cudaMemcpyDeviceToHost, gpu->stream));
    MOE_TRY(moe_gpu_wait(gpu, "sum of squares"));
    return MOE_OK;
}

extern "C" moe_status moe_swiglu_f32_forward_cuda(moe_gpu *gpu, const float *h1, const float *h3, size_t n,
                                                  float *act) {
    if (n == 0) return MOE_OK;
    if (!h1 || !h3 || !act) return MOE_ERR_INVALID_ARG;
    swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, gpu->stream>>>(h1, h3, n, act);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_swiglu_f32_backward_cuda(moe_gpu *gpu, const float *h1, const float *h3, size_t n,
                                                   float *dh1, float *dh3) {
    if (n == 0) return MOE_OK;
    if (!h1 || !h3 || !dh1 || !dh3) return MOE_ERR_INVALID_ARG;
    swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, gpu->stream>>>(h1, h3, n, dh1, dh3);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_bias_add_cuda(moe_gpu *gpu, float *x, const float *b, int rows, int n) {
    if (rows <= 0 || n <= 0) return MOE_OK;
    if (!x || !b) return MOE_ERR_INVALID_ARG;
    bias_add_kernel<<<blocks_for((size_t)rows * n), kThreads, 0, gpu->stream>>>(x, b, (size_t)rows, n);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_gate_rows_forward_cuda(moe_gpu *gpu, const float *g, const float *y, int rows, int d,
                                                 float *out) {
    if (rows <= 0 || d <= 0) return MOE_OK;
    if (!g || !y || !out) return MOE_ERR_INVALID_ARG;
    gate_rows_forward_kernel<<<blocks_for((size_t)rows * d), kThreads, 0, gpu->stream>>>(g, y, (size_t)rows, d, out);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_gate_rows_backward_cuda(moe_gpu *gpu, const float *g, const float *y, const float *dout,
                                                  int rows, int d, float *dy, float *dg) {
    if (rows <= 0 || d <= 0) return MOE_OK;
    if (!g || !y || !dout || !dy || !dg) return MOE_ERR_INVALID_ARG;
    gate_rows_backward_kernel<<<blocks_for((size_t)rows), kThreads, 0, gpu->stream>>>(g, y, dout, (size_t)rows, d, dy,
                                                                                       dg);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
