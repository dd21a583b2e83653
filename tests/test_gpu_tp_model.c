/* test_gpu_tp_model.c — the decoder model under tensor and sequence parallelism bitwise the model at tp 1 on the CUDA
 * runtime in bf16 (the CUDA experts are bf16 only): tests/test_tp_model.c's comparison, every case (the one-kv-head
 * case with the materialized and the fused attention kernel), under mpirun -np W (meson: W = 1 and 2; every rank on
 * GPU 0, the layouts' groups over the MPI-staged transport; the reference on a one-rank GPU layout in each process).
 * Where it fails it names the first gradient tensor that differs, which points at the CUDA op that writes it (what
 * test_gpu_train's "tp 2 bitwise tp 1" run of moe-train can only say of the step's weights). No ZeRO-2 here: its
 * gathered gradients are host memory in the comparison (test_gpu_train checks ZeRO-2 bitwise ZeRO-0 on the GPU).
 * Exit 77 on every rank when a rank has no GPU (the ranks agree first). */
#include "alltoall/parallel_gpu_mpi.h"
#include "tests/test_gpu_util.h"
#include "tests/test_mpi.h"
#include "tests/test_tp_model.h"

static moe_status world_layout(void *ctx, int ep, int tp, moe_parallel **out) {
    return moe_parallel_create_mpi_gpu(MPI_COMM_WORLD, 1, ep, tp, 60, moe_runtime_gpu(ctx), MOE_GPU_TRANSPORT_MPI,
                                       out);
}

static moe_status self_layout(void *ctx, moe_parallel **out) {
    return moe_parallel_create_self_gpu(moe_runtime_gpu(ctx), out);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    test_mpi_min_devices_or_skip(test_gpu_device_count("test_gpu_tp_model"), "test_gpu_tp_model");
    moe_runtime *rt;
    test_mpi_require(moe_runtime_create_cuda(0, &rt), "CUDA runtime on device 0");
    const test_tp_model_setup setup = {.rt = rt, .precision = MOE_PRECISION_BF16, .last_case = TEST_TP_MQA_FUSED,
                                       .layout = world_layout, .self = self_layout, .ctx = rt};
    test_tp_model_layouts(&setup, world, rank);
    moe_runtime_destroy(rt);
    return test_mpi_finish("test_gpu_tp_model");
}
