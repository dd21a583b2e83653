/* embedding.cu — the token embedding on the GPU, the CUDA versions of kernels/embedding_cpu.c.
 *   forward:  y[t, :] = table[tokens[t], :]; one block per token (data only moves).
 *   backward: dtable[tokens[t], :] += dy[t, :] in token order. The token ids are sorted stably with their
 *             positions (CUB radix sort: equal ids keep position order), then the block at the start of each
 *             run of one id adds that id's dy rows in position order to its dtable row, one rounded fp32 add
 *             at a time: the CPU's sequence of adds per element, hence its bits, with no atomics. Blocks that
 *             are not at a run's start return at once. A token repeated r times costs its block r serial adds.
 * Checked bitwise against the CPU by tests/test_gpu_dense_ops_a.cu (suite gpu). */
#include "core/gpu_cuda.h"

#include <climits>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cast_device.cuh"

extern "C" {
#include "kernels/embedding.h"
}

namespace {

constexpr int kThreads = 256;

/* grid = num_tokens blocks; the table holds the rows of ids [first, first + rows): -0.0 for the others */
__global__ void gather_rows(const float *table, const int *tokens, int d, int first, int rows, float *y) {
    const long row = (long)tokens[blockIdx.x] - first;
    float *dst = y + (size_t)blockIdx.x * d;
    if (row < 0 || row >= rows) {
        for (int c = threadIdx.x; c < d; c += blockDim.x) dst[c] = -0.0f;
        return;
    }
    const float *src = table + (size_t)row * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) dst[c] = src[c];
}

__global__ void iota(int n, int *out) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = i;
}

/* grid = num_tokens blocks, block i for sorted position i; sorted_pos lists positions by (token, position). */
__global__ void add_runs(const float *dy, const int *sorted_tok, const int *sorted_pos, int num_tokens, int d,
                         int first, int rows, float *dtable) {
    const int i = blockIdx.x, tok = sorted_tok[i];
    if (i > 0 && sorted_tok[i - 1] == tok) return; /* not the start of tok's run */
    if ((long)tok - first < 0 || (long)tok - first >= rows) return; /* another rank's row */
    float *row = dtable + (size_t)(tok - first) * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = row[c];
        for (int j = i; j < num_tokens && sorted_tok[j] == tok; j++)
            acc = __fadd_rn(acc, dy[(size_t)sorted_pos[j] * d + c]);
        row[c] = acc;
    }
}

size_t align_up(size_t nbytes) { return (nbytes + 255) / 256 * 256; }

} // namespace

extern "C" moe_status moe_embedding_forward_range_cuda(moe_gpu *gpu, const float *table, const int *tokens,
                                                       int num_tokens, int d, int first, int rows, float *y) {
    if (num_tokens < 0 || d < 1) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    gather_rows<<<num_tokens, moe_cuda::row_block_threads(d), 0, gpu->stream>>>(table, tokens, d, first, rows, y);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}

extern "C" moe_status moe_embedding_forward_cuda(moe_gpu *gpu, const float *table, const int *tokens, int num_tokens,
                                                 int d, float *y) {
    return moe_embedding_forward_range_cuda(gpu, table, tokens, num_tokens, d, 0, INT_MAX, y);
}

extern "C" moe_status moe_embedding_backward_cuda(moe_gpu *gpu, const float *dy, const int *tokens, int num_tokens,
                                                  int d, float *dtable) {
    return moe_embedding_backward_range_cuda(gpu, dy, tokens, num_tokens, d, 0, INT_MAX, dtable);
}

extern "C" moe_status moe_embedding_backward_range_cuda(moe_gpu *gpu, const float *dy, const int *tokens,
                                                        int num_tokens, int d, int first, int rows, float *dtable) {
    if (num_tokens < 0 || d < 1) return MOE_ERR_INVALID_ARG;
    if (num_tokens == 0) return MOE_OK;
    cudaStream_t stream = gpu->stream;
    /* Scratch, each piece 256-byte aligned: sorted_tok, pos, sorted_pos [num_tokens] int; CUB's storage.
     * All 32 key bits: the vocabulary size is not known here. */
    size_t sort_nbytes = 0;
    MOE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, sort_nbytes, (const int *)NULL, (int *)NULL, (const int *)NULL,
                                                 (int *)NULL, num_tokens, 0, 32, stream));
    const size_t ints_nbytes = align_up((size_t)num_tokens * sizeof(int));
    void *scratch = NULL;
    MOE_TRY(moe_gpu_scratch(gpu, 3 * ints_nbytes + align_up(sort_nbytes), &scratch));
    char *p = (char *)scratch;
    int *sorted_tok = (int *)p, *pos = (int *)(p + ints_nbytes), *sorted_pos = (int *)(p + 2 * ints_nbytes);
    void *temp = p + 3 * ints_nbytes;

    const int blocks = num_tokens / kThreads + 1 < 4096 ? num_tokens / kThreads + 1 : 4096;
    iota<<<blocks, kThreads, 0, stream>>>(num_tokens, pos);
    MOE_CUDA_LAUNCHED();
    MOE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, sort_nbytes, tokens, sorted_tok, pos, sorted_pos, num_tokens, 0,
                                                 32, stream));
    add_runs<<<num_tokens, moe_cuda::row_block_threads(d), 0, stream>>>(dy, sorted_tok, sorted_pos, num_tokens, d,
                                                                        first, rows, dtable);
    MOE_CUDA_LAUNCHED();
    return MOE_OK;
}
