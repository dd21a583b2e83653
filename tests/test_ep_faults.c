/* test_ep_faults.c — failures of a multi-rank job end the job with a message, never a hang.
 * Run by tests/expect_failure.sh, which requires a non-zero exit within its time limit, the expected
 * message, and no process left behind:
 *   test_ep_faults count-mismatch   rank 0 runs with another capacity factor than rank 1 (a configuration
 *                                   that differs between ranks), so it announces fewer rows for an expert of
 *                                   rank 1 than the global routing lets it send; rank 1's check names the
 *                                   ranks, layer and counts and the job aborts (or rank 0's, which sees rank 1's
 *                                   rows disagree with its own routing, when it gets there first)
 *   test_ep_faults watchdog         rank 1 never joins the exchange; rank 0's watchdog (2 s) aborts, naming rank 1
 *   test_ep_faults tree-watchdog    the same in the fixed-tree all-reduce (its point-to-point steps)
 *   test_ep_faults p2p-watchdog     rank 1 posts its send with another tag than rank 0 waits for, then stops (sleeps):
 *                                   rank 0's wait for the receive fails after its 2 s watchdog, naming the receive
 *                                   (bytes, peer, tag) and rank 1
 *   test_ep_faults p2p-send-watchdog rank 0 waits on a send of 4 MiB (past MPI's eager limit) that rank 1 never
 *                                   receives: the same, for the send
 *   test_ep_faults config EP E K    an invalid layout or layer config: every rank says why and exits 1
 *   test_ep_faults layout-bug       rank 1's dispatch layout reports a row too many for expert 0 (a fault injected
 *                                   into its table of steps); both ranks fail the forward at the router losses'
 *                                   all-reduce, each saying why, and exit 1 within seconds (before 2026-12-07 rank 0
 *                                   waited in the all-reduce for the exchange watchdog, 60 s here) */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alltoall/comm_mpi.h"
#include "alltoall/parallel_mpi.h"
#include "moe/layer_internal.h"
#include "tests/test_mpi.h"

enum { T = 16, D = 8, F = 8 };

/* Every rank runs one forward; a failure aborts the job as a program should. Rank 0 drops by token order with
 * capacity factor rank0_cf, the others are dropless, when rank0_cf > 0. */
static void forward_once(int ep, int E, int k, double timeout_s, int late_rank, float rank0_cf) {
    int rank, W;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    moe_parallel *par;
    moe_status st = moe_parallel_create_mpi(MPI_COMM_WORLD, ep, timeout_s, &par);
    if (st == MOE_ERR_INVALID_CONFIG) {
        fprintf(stderr, "rank %d: invalid layout: ep = %d must be >= 1 and divide the world size %d\n", rank, ep, W);
        MPI_Finalize();
        exit(1);
    }
    test_mpi_require(st, "parallel layout");
    moe_config cfg = moe_config_default(D, F, E, k);
    cfg.layer_index = 3;
    if (rank == 0) cfg.capacity_factor = rank0_cf;
    moe_layer *L;
    st = moe_layer_create(&cfg, NULL, par, &L); /* refuses a config that the layout's ep cannot shard */
    if (st == MOE_ERR_INVALID_CONFIG) {
        fprintf(stderr, "rank %d: invalid MoE config (E=%d, k=%d, ep=%d): %s\n", rank, E, k, ep,
                moe_failure_message(st));
        moe_parallel_destroy(par);
        MPI_Finalize();
        exit(1);
    }
    test_mpi_require(st, "create");
    moe_rng rng = moe_rng_seeded(rank);
    test_weights w = test_weights_random(&cfg, ep, &rng);
    moe_real *x = test_alloc_uniform(&rng, T * D, 1), *out = test_alloc_uniform(&rng, T * D, 0);
    if (rank == late_rank) sleep(60); /* never arrives in time */
    test_mpi_require(moe_layer_forward(L, &w.w, x, T, out, NULL), "forward");
    moe_layer_destroy(L);
    moe_parallel_destroy(par);
    test_weights_free(&w);
    free(x), free(out);
}

static const moe_layer_ops *real_steps;

static moe_status layout_with_a_row_too_many(moe_layer_state *s, const moe_token_routing *tok, int num_tokens,
                                             int *layout_counts) {
    const moe_status st = real_steps->dispatch_layout(s, tok, num_tokens, layout_counts);
    layout_counts[0]++; /* the CPU table's counts are complete on return */
    return st;
}

/* One forward on 2 ranks (ep 2, a 60 s watchdog) with rank 1's layout miscounting: each rank prints the forward's
 * failure and exits 1 (no abort: a rank left waiting would keep the job alive). */
static void layout_bug(void) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    moe_parallel *par;
    test_mpi_require(moe_parallel_create_mpi(MPI_COMM_WORLD, 2, 60, &par), "parallel layout");
    moe_config cfg = moe_config_default(D, F, 8, 2);
    moe_layer *L;
    test_mpi_require(moe_layer_create(&cfg, NULL, par, &L), "create");
    static moe_layer_ops buggy;
    real_steps = moe__layer_steps(L), buggy = *real_steps, buggy.dispatch_layout = layout_with_a_row_too_many;
    if (rank == 1) moe__layer_set_steps(L, &buggy);
    moe_rng rng = moe_rng_seeded(rank);
    test_weights w = test_weights_random(&cfg, 2, &rng);
    moe_real *x = test_alloc_uniform(&rng, T * D, 1), *out = test_alloc_uniform(&rng, T * D, 0);
    const moe_status st = moe_layer_forward(L, &w.w, x, T, out, NULL);
    if (st != MOE_OK) fprintf(stderr, "rank %d: forward failed: %s\n", rank, moe_failure_message(st));
    moe_layer_destroy(L);
    moe_parallel_destroy(par);
    test_weights_free(&w);
    free(x), free(out);
    if (st != MOE_OK) {
        MPI_Finalize();
        exit(1);
    }
}

/* Rank 1 sleeps past the 2 s watchdog of rank 0's fixed-tree all-reduce. */
static void tree_allreduce_late(void) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    moe_comm *c;
    test_mpi_require(moe_comm_create_mpi(test_mpi_dup_world(), "world", 2, &c), "comm");
    enum { COUNT = 1 << 16 };
    moe_real *buf = calloc(COUNT, sizeof *buf);
    if (rank == 1) sleep(60);
    test_mpi_require(moe_comm_allreduce_tree_real(c, buf, COUNT), "tree all-reduce");
    moe_comm_destroy(c);
    free(buf);
}

/* Rank 0 waits for a message from rank 1 that never comes: a receive (rank 1 sends with tag 8, not 7) or a send
 * of 4 MiB that rank 1 never receives; rank 1 then sleeps past rank 0's 2 s watchdog. */
static void p2p_late(int sending) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    moe_comm *c;
    test_mpi_require(moe_comm_create_mpi(test_mpi_dup_world(), "world", 2, &c), "comm");
    enum { SMALL = 64, LARGE = 4 << 20 };
    char *buf = calloc(LARGE, 1);
    moe_comm_request *req;
    if (rank == 1) {
        if (!sending) test_mpi_require(moe_comm_isend_bytes(c, buf, SMALL, 0, 8, &req), "send with another tag");
        sleep(60);
    } else if (rank == 0) {
        test_mpi_require(sending ? moe_comm_isend_bytes(c, buf, LARGE, 1, 3, &req)
                                 : moe_comm_irecv_bytes(c, buf, SMALL, 1, 7, &req),
                         "post");
        test_mpi_require(moe_comm_wait(c, req), sending ? "send" : "receive");
    }
    moe_comm_destroy(c);
    free(buf);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "count-mismatch")) {
        /* C = 2 on rank 0 while rank 0's tokens pick expert 6 (of EP rank 1: E = 8, ep = 2) more often */
        forward_once(2, 8, 2, 60, -1, 0.25f);
    } else if (!strcmp(mode, "watchdog")) {
        forward_once(2, 8, 2, 2, 1, 0);
    } else if (!strcmp(mode, "tree-watchdog")) {
        tree_allreduce_late();
    } else if (!strcmp(mode, "p2p-watchdog")) {
        p2p_late(0);
    } else if (!strcmp(mode, "p2p-send-watchdog")) {
        p2p_late(1);
    } else if (!strcmp(mode, "layout-bug")) {
        layout_bug();
    } else if (!strcmp(mode, "config") && argc == 5) {
        forward_once(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), 60, -1, 0);
    } else {
        fprintf(stderr, "usage: test_ep_faults count-mismatch | watchdog | tree-watchdog | p2p-watchdog | "
                        "p2p-send-watchdog | layout-bug | config EP E K\n");
        MPI_Finalize();
        return 2;
    }
    /* reaching here means the fault went unnoticed */
    fprintf(stderr, "rank %d: the fault was not detected\n", rank);
    MPI_Finalize();
    return 0;
}
