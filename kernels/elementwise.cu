/* elementwise.cu — y = a + b, a *= factor, the sum of squares, the fp32 SwiGLU, a bias add and a sigmoid row gate on
 * the GPU (elementwise.h): the
 * bits of the dense table's CPU entries (moe/dense_ops_cpu.c), and for the SwiGLU the CPU's operations in its order. Products and sums are written as __fadd_rn / __dmul_rn /
 * __dadd_rn so that nvcc cannot contract them into FMAs the CPU does not do.
 *
 * The sum of squares keeps the CPU's partition: chunk c of MOE__SUM_CHUNKS is one chain of double adds in
 * index order, which no parallel tree reproduces. One warp per chunk: the 32 lanes load a tile of the chunk
 * (coalesced) and square it into shared memory, then lane 0 adds the tile in order while the lanes' loads of
 * the next tile are in flight. The chain costs ~n / 64 dependent double adds (~8 cycles each): ~4 ms at
 * n = 1e8 on an H100, the price of the CPU's bits; a second one-thread kernel adds the 64 chunk sums in order.
 * Checked against the CPU table by tests/test_gpu_dense_ops_a.cu (suite gpu). */
#include "core/gpu_cuda.h"

extern "C" {
#include "core/threads.h"
#include "kernels/elementwise.h"
}

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;
constexpr int kWarp = 32;
constexpr int kPerLane = 16;                /* values each lane loads per tile */
constexpr int kTile = kWarp * kPerLane;     /* values lane 0 adds per round */

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

/* grid = MOE__SUM_CHUNKS blocks of one warp; part[c] = sum over chunk c in index order. */
__global__ void sum_squares_chunks(const float *a, size_t n, double *part) {
    __shared__ double sq[kTile];
    const int c = blockIdx.x, lane = threadIdx.x;
    const size_t lo = n * c / MOE__SUM_CHUNKS, hi = n * (c + 1) / MOE__SUM_CHUNKS;
    float v[kPerLane];
    for (int k = 0; k < kPerLane; k++) { /* element lo + lane + 32 k -> sq[lane + 32 k] */
        size_t i = lo + lane + (size_t)kWarp * k;
        v[k] = i < hi ? a[i] : 0.0f;
    }
    double t = 0;
    for (size_t base = lo; base < hi; base += kTile) {
        for (int k = 0; k < kPerLane; k++) sq[lane + kWarp * k] = __dmul_rn((double)v[k], (double)v[k]);
        __syncwarp();
        for (int k = 0; k < kPerLane; k++) {
            size_t i = base + kTile + lane + (size_t)kWarp * k;
            v[k] = i < hi ? a[i] : 0.0f;
        }
        if (lane == 0) {
            const int m = hi - base < (size_t)kTile ? (int)(hi - base) : kTile;
            for (int j = 0; j < m; j++) t = __dadd_rn(t, sq[j]);
        }
        __syncwarp(); /* lane 0 is done with sq before the next tile overwrites it */
    }
    if (lane == 0) part[c] = t;
}

__global__ void sum_in_order(const double *part, int count, double *out) {
    double t = 0;
    for (int c = 0; c < count; c++) t = __dadd_rn(t, part[c]);
    *out = t;
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

extern "C" moe_status moe_sum_squares_cuda(moe_gpu *gpu, const float *a, size_t n, double *sum) {
    if (!sum || (n > 0 && !a)) return MOE_ERR_INVALID_ARG;
    void *scratch = NULL; /* part [MOE__SUM_CHUNKS] double, then the total */
    MOE_TRY(moe_gpu_scratch(gpu, (MOE__SUM_CHUNKS + 1) * sizeof(double), &scratch));
    double *part = (double *)scratch, *total = part + MOE__SUM_CHUNKS;
    sum_squares_chunks<<<MOE__SUM_CHUNKS, kWarp, 0, gpu->stream>>>(a, n, part);
    MOE_CUDA_LAUNCHED();
    sum_in_order<<<1, 1, 0, gpu->stream>>>(part, MOE__SUM_CHUNKS, total);
    MOE_CUDA_LAUNCHED();
    double host = 0;
    MOE_CUDA_TRY(cudaMemcpyAsync(&host, total, sizeof host, cudaMemcpyDeviceToHost, gpu->stream));
    MOE_CUDA_TRY(cudaStreamSynchronize(gpu->stream));
    *sum = host;
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
