/* test_gpu_tp_pieces.c — tensor parallelism's products in fixed pieces (tp/linear.h) and the vocabulary-parallel
 * cross-entropy (tp/vocab_cross_entropy.h, its CUDA kernels) on the CUDA runtime: the same bits at every
 * tensor-parallel size, as on the CPU (tests/test_tp_products.h's checks, fp32 and bf16 inputs).
 * Under mpirun -np W (meson: W = 1 and 2; every rank on GPU 0, the group over the MPI-staged transport at W = 2): the
 * pieces' columns go through moe_runtime_copy_2d (cudaMemcpy2DAsync), the sums through the staged fixed tree.
 * Exit 77 on every rank when a rank has no GPU (the ranks agree first). */
#include "alltoall/comm_gpu_mpi.h"
#include "tests/test_gpu_util.h"
#include "tests/test_mpi.h"
#include "tests/test_tp_products.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int W, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    test_mpi_min_devices_or_skip(test_gpu_device_count("test_gpu_tp_pieces"), "test_gpu_tp_pieces");
    if (8 % W || (W & (W - 1))) test_mpi_require(MOE_ERR_INVALID_CONFIG, "1, 2, 4 or 8 ranks");
    moe_runtime *rt;
    test_mpi_require(moe_runtime_create_cuda(0, &rt), "CUDA runtime on device 0");
    moe_comm *group = NULL;
    if (W > 1)
        test_mpi_require(moe_comm_create_mpi_staged(moe_runtime_gpu(rt), test_mpi_dup_world(), "tensor-parallel", 60,
                                                    &group), "mpi-staged group");
    /* cuBLAS's SGEMM against the pieces' tree: the same tolerance as the CPU's */
    const test_tp_setup setup = {.rt = rt, .group = group, .tp = W, .rank = rank, .plain_tolerance = 1e-5,
                                 .one_piece_loss_tolerance = 1e-14};
    test_tp_check_products(&setup, MOE_PRECISION_FP32);
    test_tp_check_products(&setup, MOE_PRECISION_BF16);
    test_tp_check_cross_entropy(&setup);
    if (rank == 0) printf("tp %d on the GPU: the six products and the vocabulary-parallel cross-entropy checked\n", W);
    if (group) moe_comm_destroy(group);
    moe_runtime_destroy(rt);
    return test_mpi_finish("test_gpu_tp_pieces");
}
