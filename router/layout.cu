/* layout.cu — the dispatch layout on the GPU: counts, offsets and the stable (expert, token) permutation of
 * the kept assignments, equal to moe_router_dispatch_layout_cpu element for element. Checked exactly against
 * it by tests/test_gpu_router.cu (build: ninja -C build; run: meson test -C build --suite gpu).
 *
 *   key[a] = kept[a] ? expert[a] : E, value[a] = a       (a = t*k + j, n = T*k assignments)
 *   stable radix sort of (key, value) on the bits of 0..E: kept rows first, by expert, then by a, which
 *     within one expert is token order (a token picks an expert at most once); dropped ones last
 *   count[e] = #{a : key[a] = e} (integer histogram: exact in any order), offset = exclusive scan of
 *     count[0..E] with count[E] = 0, so offset[E] = num_kept
 *   slot[a] = row for the sorted row with key < E, else -1;  perm_token[row] = a / k */
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <limits.h>
#include <string.h>

#include "core/gpu_cuda.h"

extern "C" {
#include "router/layout.h"
}

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;
constexpr size_t kAlign = 256;
/* a per-block histogram of (E + 1) ints in static-size shared memory up to this many bins */
constexpr int kMaxSharedBins = 4096;

size_t align_up(size_t nbytes) { return (nbytes + kAlign - 1) / kAlign * kAlign; }

unsigned grid_for(int count) {
    int blocks = (count + kThreads - 1) / kThreads;
    return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

/* keys and values of the sort, and count[e] += kept assignments to e (count zeroed before; integer adds,
 * so the result does not depend on their order). Bins in shared memory when they fit. */
__global__ void make_keys(const int *expert, const unsigned char *kept, int num_assignments, int num_experts,
                          unsigned *key, int *value, int *count) {
    __shared__ int local[kMaxSharedBins];
    const bool shared = num_experts <= kMaxSharedBins;
    if (shared) {
        for (int e = threadIdx.x; e < num_experts; e += blockDim.x) local[e] = 0;
        __syncthreads();
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < num_assignments;
         i += (long long)gridDim.x * blockDim.x) {
        int a = (int)i, e = kept[a] ? expert[a] : num_experts;
        key[a] = (unsigned)e;
        value[a] = a;
        if (e < num_experts) atomicAdd(shared ? &local[e] : &count[e], 1);
    }
    if (shared) {
        __syncthreads();
        for (int e = threadIdx.x; e < num_experts; e += blockDim.x)
            if (local[e]) atomicAdd(&count[e], local[e]);
    }
}

__global__ void scatter_rows(const unsigned *sorted_key, const int *sorted_value, int num_assignments, int num_experts,
                             int top_k, int *slot, int *perm_token) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < num_assignments;
         i += (long long)gridDim.x * blockDim.x) {
        int row = (int)i, a = sorted_value[row];
        if (sorted_key[row] < (unsigned)num_experts) {
            slot[a] = row;
            perm_token[row] = a / top_k;
        } else {
            slot[a] = -1;
        }
    }
}

} // namespace

/* The host copies the caller asked for, queued: complete at the next synchronisation of the stream. */
static moe_status copy_to_host(cudaStream_t stream, const int *count, const int *offset, int num_experts,
                               int *count_host, int *offset_host) {
    const size_t counts_nbytes = (size_t)num_experts * sizeof(int);
    if (count_host) MOE_CUDA_TRY(cudaMemcpyAsync(count_host, count, counts_nbytes, cudaMemcpyDeviceToHost, stream));
    if (offset_host)
        MOE_CUDA_TRY(cudaMemcpyAsync(offset_host, offset, counts_nbytes + sizeof(int), cudaMemcpyDeviceToHost, stream));
    return MOE_OK;
}

extern "C" moe_status moe_router_dispatch_layout_cuda(moe_gpu *gpu, const int *expert, const unsigned char *kept,
                                                      int num_tokens, int num_experts, int top_k, int *slot,
                                                      int *perm_token, int *num_tokens_per_expert, int *expert_offset,
                                                      int *num_tokens_per_expert_host, int *expert_offset_host) {
    if (num_tokens < 0 || num_experts < 1 || num_experts == INT_MAX || top_k < 1 || top_k > num_experts ||
        (size_t)num_tokens * top_k > INT_MAX)
        return MOE_ERR_INVALID_ARG;
    const size_t counts_nbytes = (size_t)num_experts * sizeof(int), offsets_nbytes = counts_nbytes + sizeof(int);
    cudaStream_t stream = gpu->stream;
    if (num_tokens == 0) { /* nothing kept: zero counts and offsets, no kernel */
        MOE_CUDA_TRY(cudaMemsetAsync(num_tokens_per_expert, 0, counts_nbytes, stream));
        MOE_CUDA_TRY(cudaMemsetAsync(expert_offset, 0, offsets_nbytes, stream));
        return copy_to_host(stream, num_tokens_per_expert, expert_offset, num_experts, num_tokens_per_expert_host,
                            expert_offset_host);
    }
    const int n = num_tokens * top_k;
    int end_bit = 0; /* keys lie in [0, E]: the bits of E */
    while (end_bit < 31 && (1u << end_bit) <= (unsigned)num_experts) end_bit++;

    /* Scratch, one call, each piece 256-byte aligned:
     *   key, sorted_key [n] unsigned;  value, sorted_value [n] int;  count [E + 1] int (count[E] = 0, so the
     *   scan of E + 1 items ends with offset[E] = num_kept);  CUB temporary storage (sort or scan). */
    size_t sort_nbytes = 0, scan_nbytes = 0;
    MOE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, sort_nbytes, (const unsigned *)NULL, (unsigned *)NULL,
                                                 (const int *)NULL, (int *)NULL, n, 0, end_bit, stream));
    MOE_CUDA_TRY(cub::DeviceScan::ExclusiveSum(NULL, scan_nbytes, (const int *)NULL, (int *)NULL, num_experts + 1,
                                               stream));
    const size_t keys_nbytes = align_up((size_t)n * sizeof(int)), count_nbytes = align_up(offsets_nbytes);
    const size_t temp_nbytes = align_up(sort_nbytes > scan_nbytes ? sort_nbytes : scan_nbytes);
    void *scratch = NULL;
    MOE_TRY(moe_gpu_scratch(gpu, 4 * keys_nbytes + count_nbytes + temp_nbytes, &scratch));
    char *p = (char *)scratch;
    unsigned *key = (unsigned *)p, *sorted_key = (unsigned *)(p + keys_nbytes);
    int *value = (int *)(p + 2 * keys_nbytes), *sorted_value = (int *)(p + 3 * keys_nbytes);
    int *count = (int *)(p + 4 * keys_nbytes);
    void *temp = p + 4 * keys_nbytes + count_nbytes;

    MOE_CUDA_TRY(cudaMemsetAsync(count, 0, offsets_nbytes, stream));
    make_keys<<<grid_for(n), kThreads, 0, stream>>>(expert, kept, n, num_experts, key, value, count);
    MOE_CUDA_LAUNCHED();
    MOE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, sort_nbytes, key, sorted_key, value, sorted_value, n, 0, end_bit,
                                                 stream));
    MOE_CUDA_TRY(cub::DeviceScan::ExclusiveSum(temp, scan_nbytes, count, expert_offset, num_experts + 1, stream));
    MOE_CUDA_TRY(cudaMemcpyAsync(num_tokens_per_expert, count, counts_nbytes, cudaMemcpyDeviceToDevice, stream));
    scatter_rows<<<grid_for(n), kThreads, 0, stream>>>(sorted_key, sorted_value, n, num_experts, top_k, slot,
                                                       perm_token);
    MOE_CUDA_LAUNCHED();
    return copy_to_host(stream, num_tokens_per_expert, expert_offset, num_experts, num_tokens_per_expert_host,
                        expert_offset_host);
}
