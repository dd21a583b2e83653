/* test_gpu_tree_allreduce.c — the fixed tree on the GPU: the add kernel against its CPU twin, and the tree
 * all-reduce of the GPU transports against the test's one-process tree, bit for bit (tests/test_tree_data.h).
 * Under mpirun -np W (meson: W = 1 and 2, every rank on GPU 0 unless there are enough devices):
 *   add kernel  moe__tree_add_f32_cuda vs moe_tree_add_f32_cpu on mixed-magnitude data, out of place and in place
 *               on either operand, counts 0 .. 2^20 + 3
 *   self-gpu    a world of one on every rank: the tree of one leaf-sum is that sum
 *   mpi-staged  on the world (ranks may share a GPU)
 *   nccl        (builds with NCCL) when every rank has a device of its own: W = 1, or W <= device count
 * For each transport, each algorithm (auto, doubling, halving + doubling) and counts 0, 1, 7, 1000, 1001, 2^20:
 * rank r sums its S/W of S = 16 leaves on the host (moe_tree_acc), uploads, all-reduces on the device, and the
 * download must equal the oracle's tree over all S leaves; the double variant (host memory on every transport)
 * likewise; and for floats the tree's halves (reduce-scatter then all-gather, window by window, with uneven splits).
 * Exit 77 on every rank when a rank has no GPU (the ranks agree first). */
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_gpu_mpi.h"
#include "alltoall/comm_mpi.h"
#include "alltoall/tree_add.h"
#include "alltoall/tree_add_cuda.h"
#include "core/gpu_cuda.h"
#include "tests/test_gpu_util.h"
#include "tests/test_mpi.h"
#include "tests/test_tree_data.h"

static const size_t kCounts[] = {0, 1, 7, 1000, 1001, 1u << 20};
static const moe_tree_algorithm kAlgos[] = {MOE_TREE_AUTO, MOE_TREE_RECURSIVE_DOUBLING, MOE_TREE_HALVING_DOUBLING};
static const char *const kAlgoNames[] = {"auto", "doubling", "halving+doubling"};
enum { SEED = 16 };

static void *alloc_host(size_t nbytes) {
    void *p = malloc(nbytes ? nbytes : 1);
    if (!p) test_mpi_require(MOE_ERR_OUT_OF_MEMORY, "host buffer");
    return p;
}

/* which: 0 out of place, 1 in place on lower, 2 in place on higher */
static void check_add_kernel(moe_gpu *gpu, size_t count, int which) {
    const size_t nbytes = count * sizeof(float);
    float *a = alloc_host(nbytes), *b = alloc_host(nbytes), *want = alloc_host(nbytes), *got = alloc_host(nbytes);
    test_tree_fill_leaf(MOE_TREE_F32, SEED, 0, count, a);
    test_tree_fill_leaf(MOE_TREE_F32, SEED, 1, count, b);
    moe_tree_add_f32_cpu(want, a, b, count);
    float *da = test_gpu_upload(gpu, a, nbytes), *db = test_gpu_upload(gpu, b, nbytes);
    float *dy = test_gpu_alloc(gpu, nbytes);
    float *y = which == 0 ? dy : which == 1 ? da : db;
    CHECK_OK(moe__tree_add_f32_cuda(gpu->stream, y, da, db, count));
    test_gpu_download(gpu, got, y, nbytes);
    size_t first, bad = test_tree_count_diff(MOE_TREE_F32, got, want, count, &first);
    CHECK(bad == 0, "add kernel, %zu values, %s: %zu differ from the CPU twin, first at %zu", count,
          which == 0 ? "out of place" : which == 1 ? "y = lower" : "y = higher", bad, first);
    test_gpu_free(gpu, da), test_gpu_free(gpu, db), test_gpu_free(gpu, dy);
    free(a), free(b), free(want), free(got);
}

/* The tree's halves (ZeRO-2) on the transport's payload memory: a region of `count` floats with splits allowed at a
 * third and two thirds, reduce-scattered window by window (its two halves, the upper first, as a backward runs
 * layers from the last), then all-gathered: this rank's range of each window must equal the one-process tree after
 * the reduce-scatter, and every value after the all-gather. */
static void check_halves(const char *name, moe_comm *c, moe_gpu *gpu, const float *mine, const float *want,
                         size_t count) {
    const int W = moe_comm_size(c), r = moe_comm_rank(c);
    const size_t bounds[] = {count / 3, 2 * count / 3}, half = count / 2;
    const moe_tree_partition part = {count, count >= 3 ? bounds : NULL, count >= 3 ? 2 : 0};
    size_t lo, hi;
    moe_tree_partition_range(&part, W, r, &lo, &hi);
    float *got = alloc_host(count * sizeof(float));
    float *dev = test_gpu_upload(gpu, mine, count * sizeof(float));
    const size_t from[] = {half, 0}, n[] = {count - half, half};
    for (int w = 0; w < 2; w++)
        test_mpi_require(moe_comm_reduce_scatter_tree_real(c, dev + from[w], &part, from[w], n[w]), "reduce-scatter");
    test_gpu_download(gpu, got, dev, count * sizeof(float));
    size_t first, bad = test_tree_count_diff(MOE_TREE_F32, got + lo, want + lo, hi - lo, &first);
    CHECK(bad == 0, "%s rank %d of %d, %zu values: reduce-scatter, %zu of its range [%zu, %zu) differ, first at %zu",
          name, r, W, count, bad, lo, hi, lo + first);
    for (int w = 0; w < 2; w++)
        test_mpi_require(moe_comm_allgather_tree_real(c, dev + from[w], &part, from[w], n[w]), "all-gather");
    test_gpu_download(gpu, got, dev, count * sizeof(float));
    bad = test_tree_count_diff(MOE_TREE_F32, got, want, count, &first);
    CHECK(bad == 0, "%s rank %d of %d, %zu values: all-gather, %zu differ, first at %zu", name, r, W, count, bad,
          first);
    test_gpu_free(gpu, dev);
    free(got);
}

static void check_transport(const char *name, moe_comm *c, moe_gpu *gpu) {
    const int W = moe_comm_size(c), r = moe_comm_rank(c), span = TEST_TREE_LEAVES / W;
    for (size_t k = 0; k < sizeof kCounts / sizeof kCounts[0]; k++)
        for (int d = 0; d < 2; d++) {
            const moe_tree_dtype dtype = d ? MOE_TREE_F64 : MOE_TREE_F32;
            const size_t count = kCounts[k], nbytes = count * test_tree_elem_nbytes(dtype);
            void *want = alloc_host(nbytes), *mine = alloc_host(nbytes), *got = alloc_host(nbytes);
            test_tree_oracle(dtype, SEED, 0, TEST_TREE_LEAVES, count, want);
            test_tree_local(dtype, SEED, r * span, span, count, mine);
            for (size_t a = 0; a < sizeof kAlgos / sizeof kAlgos[0]; a++) {
                moe_comm_set_tree_algorithm(c, kAlgos[a]);
                if (dtype == MOE_TREE_F64) { /* a control entry: host memory on every transport */
                    if (nbytes) memcpy(got, mine, nbytes);
                    test_mpi_require(moe_comm_allreduce_tree_f64(c, got, count), "tree all-reduce (double)");
                } else {
                    void *dev = test_gpu_upload(gpu, mine, nbytes);
                    test_mpi_require(moe_comm_allreduce_tree_real(c, dev, count), "tree all-reduce (float)");
                    test_gpu_download(gpu, got, dev, nbytes);
                    test_gpu_free(gpu, dev);
                }
                size_t first, bad = test_tree_count_diff(dtype, got, want, count, &first);
                CHECK(bad == 0, "%s rank %d of %d, %s, %s, %zu values: %zu differ from the one-process tree, first "
                      "at %zu", name, r, W, kAlgoNames[a], d ? "double" : "float", count, bad, first);
            }
            if (dtype == MOE_TREE_F32) check_halves(name, c, gpu, mine, want, count);
            free(want), free(mine), free(got);
        }
    moe_comm_set_tree_algorithm(c, MOE_TREE_AUTO);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
        printf("%-10s on %d rank(s): tree all-reduce, reduce-scatter and all-gather checked bitwise\n", name, W);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int W, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const int min_devices =
        test_mpi_min_devices_or_skip(test_gpu_device_count("test_gpu_tree_allreduce"), "test_gpu_tree_allreduce");
    if (TEST_TREE_LEAVES % W || (W & (W - 1))) test_mpi_require(MOE_ERR_INVALID_CONFIG, "a power of two of ranks");
    moe_gpu *gpu = test_gpu_require("test_gpu_tree_allreduce"); /* device 0, shared by all ranks */

    const size_t add_counts[] = {0, 1, 1000, (1u << 20) + 3};
    for (size_t k = 0; k < sizeof add_counts / sizeof add_counts[0]; k++)
        for (int which = 0; which < 3; which++) check_add_kernel(gpu, add_counts[k], which);

    moe_comm *c;
    test_mpi_require(moe_comm_create_self_gpu(gpu, "self-gpu", &c), "self-gpu comm");
    check_transport("self-gpu", c, gpu);
    moe_comm_destroy(c);

    test_mpi_require(moe_comm_create_mpi_staged(gpu, test_mpi_dup_world(), "staged", 60, &c), "mpi-staged comm");
    check_transport("mpi-staged", c, gpu);
    moe_comm_destroy(c);

#ifdef MOE_HAVE_NCCL
    if (W == 1 || min_devices >= W) {
        moe_gpu *own = gpu; /* NCCL refuses two ranks on one device: one each */
        if (W > 1) test_mpi_require(moe_gpu_create(rank, &own), "context on a device of this rank's own");
        test_mpi_require(moe_comm_create_nccl(own, test_mpi_dup_world(), "nccl", 60, &c), "nccl comm");
        check_transport("nccl", c, own);
        moe_comm_destroy(c);
        if (own != gpu) moe_gpu_destroy(own);
    } else if (rank == 0) {
        printf("nccl       not checked: %d ranks share %d device(s)\n", W, min_devices);
    }
#else
    if (rank == 0) printf("nccl       not in this build\n");
#endif
    moe_gpu_destroy(gpu);
    return test_mpi_finish("test_gpu_tree_allreduce");
}
