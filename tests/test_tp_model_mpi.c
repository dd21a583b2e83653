/* test_tp_model_mpi.c — the decoder model under tensor and sequence parallelism (issue 28; models/model.h, "Tensor
 * parallelism") bitwise the model at tp 1, under mpirun -np W (1, 2, 4, 8), on the CPU in fp32: the comparison of
 * tests/test_tp_model.c (every layout of tp x ep, ZeRO-2 at ep 1, the plain split; the one-kv-head case with the
 * materialized kernel), then the refusals: tp and the kv heads neither dividing the other, tp_shards not dividing a
 * dense FFN's d_ff or the vocabulary, tp_shards not a multiple of tp. tests/test_gpu_tp_model.c runs the same
 * comparison on CUDA. */
#include <string.h>

#include "alltoall/parallel_mpi.h"
#include "core/fail.h"
#include "models/zero.h"
#include "tests/test_mpi.h"
#include "tests/test_tp_model.h"

enum { PIECES = 8 };

static moe_status world_layout(void *ctx, int ep, int tp, moe_parallel **out) {
    (void)ctx;
    return moe_parallel_create_mpi_tp(MPI_COMM_WORLD, 1, ep, tp, 60, out);
}

static moe_status self_layout(void *ctx, moe_parallel **out) {
    (void)ctx;
    return moe_parallel_create_self(out);
}

/* Refused up front, with the reason, on every rank alike (before any exchange). */
static void refused(moe_model_config cfg, int tp, const char *want) {
    moe_parallel *par;
    test_mpi_require(moe_parallel_create_mpi_tp(MPI_COMM_WORLD, 1, 1, tp, 60, &par), "the layout");
    moe_model *m = NULL;
    moe_failure_clear();
    const moe_status st = moe_model_create(&cfg, NULL, par, 2, 1, &m);
    const char *msg = moe_failure_message(st);
    CHECK(st == MOE_ERR_INVALID_CONFIG && strstr(msg, want), "want a refusal naming \"%s\", got %s: %s", want,
          moe_status_string(st), msg);
    if (moe_parallel_ranks(par).world_rank == 0) printf("refused: %s\n", msg);
    moe_model_destroy(m);
    moe_parallel_destroy(par);
}

static void test_refusals(int world) {
    if (world < 2) return;
    const int tp = world >= 4 ? 4 : 2;
    moe_model_config c = test_tp_model_config(TEST_TP_GQA_TIED, PIECES);
    c.d_model = c.moe.d_model = 48, c.num_heads = 12, c.num_kv_heads = 3; /* neither divides the other */
    refused(c, tp, "tp and the number of kv heads: one must divide the other");
    c = test_tp_model_config(TEST_TP_DENSE_FFN, PIECES);
    c.d_ff = 36, c.moe.d_ff = 36;
    refused(c, 2, "tp_shards must divide d_ff");
    c = test_tp_model_config(TEST_TP_DROPLESS, 1);
    refused(c, 2, "tp_shards must be a power of two that tp divides");
    c = test_tp_model_config(TEST_TP_DROPLESS, PIECES);
    c.vocab_size = 60; /* not a multiple of the 8 pieces */
    refused(c, 2, "tp_shards must divide the vocabulary size");
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    moe__zero_set_atom_values(40); /* the norm's atoms cut the pieces (tensors of 64 to 2048 values here) */
    const test_tp_model_setup setup = {.precision = MOE_PRECISION_FP32, .last_case = TEST_TP_MQA_MATERIALIZED,
                                       .zero2 = 1, .layout = world_layout, .self = self_layout};
    test_tp_model_layouts(&setup, world, rank);
    test_refusals(world);
    return test_mpi_finish("test_tp_model_mpi");
}
