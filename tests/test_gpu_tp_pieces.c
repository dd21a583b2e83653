/* test_gpu_tp_pieces.c — tensor parallelism's sums over fixed pieces (tp/piece_sum.h) on the CUDA runtime: the same
 * bits at every tensor-parallel size, as on the CPU (tests/test_tp_pieces_mpi.c).
 *
 * Under mpirun -np W (meson: W = 1 and 2; every rank on GPU 0, the group over the MPI-staged transport at W = 2):
 * the row-parallel forward (T 37, K 64, out 24) and the column-parallel input gradient (beta 0 and 1), fp32 and bf16
 * inputs (the weights' bf16 copies made on the device), row blocking on. For S = W and 8: every rank's result is
 * bitwise the same call at tp 1 on the whole operands (on the same GPU), and within 1e-4 (relative to the largest) of
 * the CPU's plain product; at S = 1 the call is the CUDA table's plain product bit for bit. The pieces' columns go
 * through moe_runtime_copy_2d (cudaMemcpy2DAsync) at tp 1 with S > 1 and at S = 8 on 2 ranks.
 * Exit 77 on every rank when a rank has no GPU (the ranks agree first). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_gpu_mpi.h"
#include "kernels/gemm_rows.h"
#include "moe/dense_ops.h"
#include "tests/test_gpu_util.h"
#include "tests/test_mpi.h"
#include "tests/test_tp_blocks.h"
#include "tp/piece_sum.h"

enum { T = 37, K = 64, OUT = 24, SEED = 28 };

static int W, rank;
static moe_runtime *rt;
static moe_gpu *gpu;

typedef enum { ROW_FORWARD, COLUMN_BETA0, COLUMN_BETA1 } product;
static const char *const kNames[] = {"row-parallel forward", "column-parallel dx (beta 0)",
                                     "column-parallel dx (beta 1)"};

/* the product at S pieces on group (NULL: tp 1 on the whole operands), host in and out: a [T, K]; w [OUT, K] (row)
 * or [K, OUT] (column); result [T, OUT] (holding dx0 for beta 1) */
static void run(moe_dense_state *dense, moe_comm *group, int S, product p, const moe_real *a, const moe_real *w,
                moe_real *result) {
    moe_tp_piece_sum s;
    test_mpi_require(moe_tp_piece_sum_init(&s, rt, dense, group, S), "piece sum");
    const int tp = group ? W : 1, part = group ? rank : 0;
    moe_real *a_host = test_tp_column_block(a, T, K, part, tp);
    moe_real *w_host = p == ROW_FORWARD ? test_tp_column_block(w, OUT, K, part, tp) : NULL;
    const moe_real *w_rows = w + (size_t)part * (K / tp) * OUT;
    const size_t n = (size_t)T * OUT, wn = (size_t)OUT * K / tp;
    moe_real *a_dev = test_gpu_upload(gpu, a_host, sizeof *a_dev * T * K / tp);
    moe_real *w_dev = test_gpu_upload(gpu, w_host ? w_host : w_rows, sizeof *w_dev * wn);
    moe_real *y_dev = test_gpu_upload(gpu, result, sizeof *y_dev * n);
    if (p == ROW_FORWARD)
        test_mpi_require(moe_tp_row_parallel_forward(&s, a_dev, w_dev, T, K, OUT, y_dev), "row forward");
    else
        test_mpi_require(moe_tp_column_parallel_backward_input(&s, a_dev, w_dev, T, OUT, K, p == COLUMN_BETA1, y_dev),
                         "column backward");
    test_gpu_download(gpu, result, y_dev, sizeof *result * n);
    test_gpu_free(gpu, a_dev), test_gpu_free(gpu, w_dev), test_gpu_free(gpu, y_dev);
    free(a_host), free(w_host);
    moe_tp_piece_sum_free(&s);
}

/* the CUDA table's plain product (host in and out) */
static void plain_product(moe_dense_state *dense, product p, const moe_real *a, const moe_real *w, moe_real *y) {
    const moe_dense_ops *ops = moe_runtime_dense_ops(rt);
    moe_real *a_dev = test_gpu_upload(gpu, a, sizeof *a * T * K), *w_dev = test_gpu_upload(gpu, w, sizeof *w * K * OUT);
    moe_real *y_dev = test_gpu_upload(gpu, y, sizeof *y * T * OUT);
    if (p == ROW_FORWARD) test_mpi_require(ops->linear_forward(dense, a_dev, w_dev, T, K, OUT, y_dev), "linear");
    else test_mpi_require(ops->linear_backward_input(dense, a_dev, w_dev, T, OUT, K, p == COLUMN_BETA1, y_dev), "dx");
    test_gpu_download(gpu, y, y_dev, sizeof *y * T * OUT);
    test_gpu_free(gpu, a_dev), test_gpu_free(gpu, w_dev), test_gpu_free(gpu, y_dev);
}

static void check(moe_comm *group, moe_precision precision) {
    const moe_dense_ops *ops = moe_runtime_dense_ops(rt);
    moe_dense_state *dense;
    test_mpi_require(ops->create(rt, 1, precision, K, &dense), "dense state");
    moe_rng rng = moe_rng_seeded(SEED);
    moe_real *x = test_alloc_uniform(&rng, (size_t)T * K, 1), *w = test_alloc_uniform(&rng, (size_t)OUT * K, 0.1);
    moe_real *dx0 = test_alloc_uniform(&rng, (size_t)T * OUT, 1);
    if (precision == MOE_PRECISION_BF16) moe_round_bf16_cpu(w, (size_t)OUT * K, w); /* the weights' bf16 copies */
    const size_t n = (size_t)T * OUT;
    moe_real *got = malloc(sizeof *got * n), *want = malloc(sizeof *want * n), *plain = malloc(sizeof *plain * n);
    for (product p = ROW_FORWARD; p <= COLUMN_BETA1; p++) {
        const char *name = kNames[p], *prec = moe_precision_name(precision);
        memcpy(plain, dx0, sizeof *plain * n), memcpy(want, dx0, sizeof *want * n);
        plain_product(dense, p, x, w, plain);
        run(dense, NULL, 1, p, x, w, want);
        CHECK(test_tp_count_diff(want, plain, n) == 0, "%s, %s: one piece is not the plain product", name, prec);
        const int sizes[] = {W, 8};
        for (int i = 0; i < 2; i++) {
            if (i == 1 && sizes[1] == W) continue;
            const int S = sizes[i];
            memcpy(want, dx0, sizeof *want * n), memcpy(got, dx0, sizeof *got * n);
            run(dense, NULL, S, p, x, w, want);
            run(dense, group, S, p, x, w, got);
            const size_t diff = test_tp_count_diff(got, want, n);
            CHECK(diff == 0, "%s, %s, S %d: tp %d differs from tp 1 in %zu of %zu values", name, prec, S, W, diff, n);
            double scale = 0, err = 0;
            for (size_t j = 0; j < n; j++) scale = fmax(scale, fabs((double)plain[j]));
            for (size_t j = 0; j < n; j++) err = fmax(err, fabs((double)want[j] - (double)plain[j]));
            CHECK(err <= 1e-4 * scale, "%s, %s, S %d: %g from the plain product (scale %g)", name, prec, S, err, scale);
        }
    }
    free(x), free(w), free(dx0), free(got), free(want), free(plain);
    ops->destroy(dense);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    test_mpi_min_devices_or_skip(test_gpu_device_count("test_gpu_tp_pieces"), "test_gpu_tp_pieces");
    if (8 % W || (W & (W - 1))) test_mpi_require(MOE_ERR_INVALID_CONFIG, "1, 2, 4 or 8 ranks");
    test_mpi_require(moe_runtime_create_cuda(0, &rt), "CUDA runtime on device 0");
    gpu = moe_runtime_gpu(rt);
    moe_comm *group = NULL;
    if (W > 1)
        test_mpi_require(moe_comm_create_mpi_staged(gpu, test_mpi_dup_world(), "tensor-parallel", 60, &group),
                         "mpi-staged group");
    check(group, MOE_PRECISION_FP32);
    check(group, MOE_PRECISION_BF16);
    if (rank == 0) printf("tp %d on the GPU: products checked at S = %d and 8\n", W, W);
    if (group) moe_comm_destroy(group);
    moe_runtime_destroy(rt);
    return test_mpi_finish("test_gpu_tp_pieces");
}
