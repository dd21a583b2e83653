/* test_p2p_mpi.c — point-to-point on the MPI transport (alltoall/comm.h), under mpirun -np W (1, 2, 4):
 *   the shared driver (tests/test_p2p.h) on the world, and on a communicator whose ranks are the world's reversed
 *   (peers are ranks of the communicator, not of the world);
 *   sizes that disagree: a shorter send fails the receive with MOE_ERR_COUNT_MISMATCH, a longer one with
 *   MOE_ERR_COMM (MPI's truncation; between two ranks: Open MPI does not report it for a rank's message to itself),
 *   each message naming the receive;
 *   collectives while messages are in flight: a receive posted before a fixed-tree all-reduce, whose own
 *   point-to-point steps must not match it (the caller's tag 15 is the tree's tag inside MPI without the offset),
 *   and an all-reduce.
 *   the exchanges of the pipeline's 1F1B and interleaved schedules (test_p2p.h), receives posted at their step
 *   and all at the start, and with one tag for all (the order nccl matches in: the schedules' orders agree).
 * The watchdog over a wait whose send never comes: tests/test_ep_faults.c (p2p-watchdog, p2p-send-watchdog). */
#include <string.h>

#include "alltoall/comm_mpi.h"
#include "core/fail.h"
#include "tests/test_mpi.h"
#include "tests/test_p2p.h"

static void check_size_mismatch(moe_comm *c) {
    const int me = moe_comm_rank(c), W = moe_comm_size(c), right = (me + 1) % W, left = (me + W - 1) % W;
    char send[16] = {0}, recv[8];
    moe_comm_request *s, *r;
    CHECK_OK(moe_comm_irecv_bytes(c, recv, 8, left, 9, &r));
    CHECK_OK(moe_comm_isend_bytes(c, send, 4, right, 9, &s));
    moe_status st = moe_comm_wait(c, r);
    CHECK(st == MOE_ERR_COUNT_MISMATCH && strstr(moe_failure_message(st), "receive of 8 bytes from rank"),
          "4 bytes into a receive of 8: %s", moe_failure_message(st));
    CHECK_OK(moe_comm_wait(c, s));
    if (right == me) return; /* Open MPI truncates a rank's message to itself silently (measured: 4.1, self btl) */
    CHECK_OK(moe_comm_irecv_bytes(c, recv, 8, left, 10, &r));
    CHECK_OK(moe_comm_isend_bytes(c, send, 16, right, 10, &s));
    st = moe_comm_wait(c, r);
    CHECK(st == MOE_ERR_COMM && strstr(moe_failure_message(st), "receive of 8 bytes from rank"),
          "16 bytes into a receive of 8: %s", moe_failure_message(st));
    CHECK_OK(moe_comm_wait(c, s));
}

static void check_beside_collectives(moe_comm *c) {
    const int me = moe_comm_rank(c), W = moe_comm_size(c), right = (me + 1) % W, left = (me + W - 1) % W;
    enum { COUNT = 1024 };
    moe_real tree[COUNT], want_tree = 0;
    double x = 1;
    int mine = 1000 + me, got = -1;
    for (int i = 0; i < COUNT; i++) tree[i] = (moe_real)(me + 1);
    for (int p = 0; p < W; p++) want_tree += (moe_real)(p + 1);
    moe_comm_request *r, *s;
    CHECK_OK(moe_comm_irecv_bytes(c, &got, sizeof got, left, 15, &r));
    if ((W & (W - 1)) == 0) CHECK_OK(moe_comm_allreduce_tree_real(c, tree, COUNT));
    CHECK_OK(moe_comm_allreduce_sum_f64(c, &x, 1));
    CHECK_OK(moe_comm_isend_bytes(c, &mine, sizeof mine, right, 15, &s));
    CHECK_OK(moe_comm_wait(c, s));
    CHECK_OK(moe_comm_wait(c, r));
    CHECK(got == 1000 + left, "rank %d: received %d, want %d", me, got, 1000 + left);
    CHECK(x == W, "all-reduce beside a posted receive: %g", x);
    if ((W & (W - 1)) == 0)
        CHECK(tree[0] == want_tree && tree[COUNT - 1] == want_tree, "tree all-reduce: %g", (double)tree[0]);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, W;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    moe_comm *world, *reversed;
    test_mpi_require(moe_comm_create_mpi(test_mpi_dup_world(), "world", 60, &world), "world comm");
    MPI_Comm split;
    if (MPI_Comm_split(MPI_COMM_WORLD, 0, W - 1 - rank, &split) != MPI_SUCCESS)
        test_mpi_require(MOE_ERR_COMM, "MPI_Comm_split");
    test_mpi_require(moe_comm_create_mpi(split, "reversed", 60, &reversed), "reversed comm");
    CHECK(moe_comm_rank(reversed) == W - 1 - rank, "reversed rank %d", moe_comm_rank(reversed));

    test_p2p_check(world, &test_p2p_host, "mpi", 1);
    test_p2p_check(reversed, &test_p2p_host, "mpi reversed", 1);
    check_size_mismatch(world);
    check_beside_collectives(world);
    test_p2p_check_pipeline(world, "mpi pipeline", 0, 0);
    test_p2p_check_pipeline(world, "mpi pipeline, receives posted early", 1, 0);
    test_p2p_check_pipeline(world, "mpi pipeline, one tag (nccl's matching)", 1, 1);
    if (rank == 0) printf("mpi on %d rank(s): rings, tags, refusals, size mismatches, beside collectives\n", W);
    moe_comm_destroy(reversed);
    moe_comm_destroy(world);
    return test_mpi_finish("test_p2p_mpi");
}
