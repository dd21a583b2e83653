/* test_alltoall_mpi.c — the expert-parallel exchanges, checked exactly (DeepEP's provenance test).
 * Under mpirun -np W, for every ep dividing W: each rank routes its own (uneven) number of tokens, capacity
 * is applied globally (router/capacity.h, with its O(E + T) control traffic), and payload rows encode
 * (source world rank, token, column) as exact integers. An oracle gathers the whole global routing on every
 * rank (this test's own MPI_Allgatherv) and runs the single-rank rule on it. Checks: each rank's kept flags
 * equal the oracle's; the counts each rank receives equal those the oracle derives; the count check of the
 * witnesses passes; every received row is the expected one, in expert-major (expert, source rank, token)
 * order; combine brings back exactly what was sent; combine(dispatch(x)) with unit gates is x times each
 * token's kept fan-out. Cases: uniform random routing with drops by score and by token order, dropless, and
 * a skewed one where every token picks experts 0 and 1, so every other EP rank receives zero rows. */
#include <stdlib.h>
#include <string.h>

#include "alltoall/dispatch.h"
#include "alltoall/parallel_mpi.h"
#include "kernels/permute.h"
#include "router/capacity.h"
#include "router/layout.h"
#include "tests/test_mpi.h"

enum { E = 8, K = 2, D = 4 };

static moe_real payload(int world_rank, int token, int col) {
    return (moe_real)((world_rank * 1024 + token) * D + col);
}

/* The whole batch's routing, gathered by the test, and the single-rank rule's verdict on it. */
typedef struct {
    int *first_token;   /* [W + 1] */
    int *expert, *kept; /* [T_global * K] */
} oracle;

static oracle gather_oracle(int W, int T, const int *expert, const moe_real *score, float cf, moe_drop_priority prio) {
    oracle o;
    int *counts = malloc((size_t)W * sizeof(int)), *displs = malloc((size_t)W * sizeof(int));
    o.first_token = calloc((size_t)W + 1, sizeof(int));
    MPI_Allgather(&T, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD);
    for (int p = 0; p < W; p++) o.first_token[p + 1] = o.first_token[p] + counts[p];
    const int TG = o.first_token[W];
    for (int p = 0; p < W; p++) counts[p] *= K, displs[p] = o.first_token[p] * K;
    o.expert = malloc((size_t)TG * K * sizeof(int));
    o.kept = malloc((size_t)TG * K * sizeof(int));
    moe_real *all_score = malloc((size_t)TG * K * sizeof(moe_real));
    unsigned char *kept = malloc((size_t)TG * K);
    int selected[E], capacity;
    MPI_Allgatherv(expert, T * K, MPI_INT, o.expert, counts, displs, MPI_INT, MPI_COMM_WORLD);
    MPI_Allgatherv(score, T * K, MPI_FLOAT, all_score, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
    CHECK_OK(moe_router_apply_capacity_cpu(o.expert, all_score, TG, E, K, cf, prio, kept, selected, &capacity));
    for (int a = 0; a < TG * K; a++) o.kept[a] = kept[a];
    free(counts), free(displs), free(all_score), free(kept);
    return o;
}

static void run_case(const moe_parallel *par, int skewed, float cf, moe_drop_priority prio) {
    const moe_ranks me = moe_parallel_ranks(par);
    const int T = 20 + 7 * me.world_rank, EL = E / me.ep_size;
    moe_comm *ep = moe_parallel_ep(par);
    int *expert = malloc((size_t)T * K * sizeof(int)), *slot = malloc((size_t)T * K * sizeof(int));
    int *perm_token = malloc((size_t)T * K * sizeof(int)), layout_counts[E], offsets[E + 1];
    int witness[E * MOE_COUNT_WITNESS_INTS];
    moe_real *score = malloc((size_t)T * K * sizeof(moe_real));
    unsigned char *kept = malloc((size_t)T * K);
    moe_routing_counts counts;
    moe_dispatch_plan plan;
    test_mpi_require(moe_routing_counts_alloc(&counts, E), "counts alloc");
    test_mpi_require(moe_dispatch_plan_alloc(&plan, me.ep_size, EL, MOE_COUNT_WITNESS_INTS, 1), "plan alloc");
    moe_rng rng = moe_rng_seeded(100 * me.world_rank + skewed);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e = skewed ? j : (int)(moe_rng_next(&rng) % E);
            while (j == 1 && e == expert[t * K]) e = (e + 1) % E;
            expert[t * K + j] = e;
            score[t * K + j] = (moe_real)moe_rng_uniform(&rng);
        }
    counts.num_tokens = T;
    test_mpi_require(moe_router_global_capacity(moe_parallel_world(par), cf, prio, E, K, expert, score, kept, &counts),
                     "global capacity");
    oracle o = gather_oracle(me.world_size, T, expert, score, cf, prio);
    for (int a = 0; a < T * K; a++)
        CHECK(kept[a] == o.kept[o.first_token[me.world_rank] * K + a],
              "rank %d assignment %d: kept %d, the single-rank "
              "rule says %d",
              me.world_rank, a, kept[a], o.kept[o.first_token[me.world_rank] * K + a]);
    moe_router_dispatch_layout_cpu(expert, kept, T, E, K, slot, perm_token, layout_counts, offsets);
    CHECK(!memcmp(layout_counts, counts.num_tokens_per_expert, sizeof layout_counts),
          "rank %d: layout and rule "
          "disagree on the counts",
          me.world_rank);

    moe_real *x = malloc((size_t)T * D * sizeof *x), *xp = malloc((size_t)T * K * D * sizeof *x);
    moe_real *back = malloc((size_t)T * K * D * sizeof *x), *sum = malloc((size_t)T * D * sizeof *x);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++) x[t * D + c] = payload(me.world_rank, t, c);
    moe_permute_rows_cpu(x, perm_token, counts.total_kept, D, xp);

    moe_router_count_witness(&counts, E, witness);
    test_mpi_require(moe_dispatch_plan_exchange(ep, counts.num_tokens_per_expert, witness, NULL, &plan), "counts");
    test_mpi_require(moe_router_check_announced(&plan, &counts, prio, me, 0), "count check");
    int want_total = 0;
    for (int p = 0; p < me.ep_size; p++) {
        const int src = me.edp_rank * me.ep_size + p;
        for (int le = 0; le < EL; le++) {
            int want = 0;
            for (int a = o.first_token[src] * K; a < o.first_token[src + 1] * K; a++)
                want += o.kept[a] && o.expert[a] == me.ep_rank * EL + le;
            CHECK(plan.recv_counts[p * EL + le] == want, "rank %d: EP rank %d sends %d rows for local expert %d, the "
                  "global routing says %d", me.world_rank, p, plan.recv_counts[p * EL + le], le, want);
            want_total += want;
        }
    }
    CHECK(plan.num_recv == want_total, "received %d rows, global routing says %d", plan.num_recv, want_total);

    size_t n = plan.num_recv ? plan.num_recv : 1;
    moe_real *staging = malloc(n * D * sizeof *x), *rows = malloc(n * D * sizeof *x);
    test_mpi_require(moe_dispatch_rows(ep, &plan, xp, D * sizeof(moe_real), staging, rows), "dispatch");
    /* expected order: local expert, then source rank of the EP group, then token; kept only */
    int row = 0;
    for (int le = 0; le < EL; le++)
        for (int p = 0; p < me.ep_size; p++) {
            int src = me.edp_rank * me.ep_size + p;
            for (int gt = o.first_token[src]; gt < o.first_token[src + 1]; gt++)
                for (int j = 0; j < K; j++) {
                    int a = gt * K + j;
                    if (!o.kept[a] || o.expert[a] != me.ep_rank * EL + le) continue;
                    int t = gt - o.first_token[src];
                    for (int c = 0; c < D && row < plan.num_recv; c++)
                        CHECK(rows[(size_t)row * D + c] == payload(src, t, c),
                              "rank %d row %d col %d: got %g, want (rank %d, token %d)", me.world_rank, row, c,
                              (double)rows[(size_t)row * D + c], src, t);
                    row++;
                }
        }
    CHECK(row == plan.num_recv, "rank %d: expected %d rows, received %d", me.world_rank, row, plan.num_recv);

    test_mpi_require(moe_combine_rows(ep, &plan, rows, D * sizeof(moe_real), staging, back), "combine");
    CHECK(!memcmp(back, xp, (size_t)counts.total_kept * D * sizeof *x), "rank %d: combine did not return the sent rows",
          me.world_rank);
    moe_combine_rows_cpu(back, slot, NULL, T, K, D, sum);
    for (int t = 0; t < T; t++) {
        int fan_out = kept[t * K] + kept[t * K + 1];
        for (int c = 0; c < D; c++)
            CHECK(sum[t * D + c] == fan_out * x[t * D + c], "rank %d token %d: round trip %g, want %d x %g",
                  me.world_rank, t, (double)sum[t * D + c], fan_out, (double)x[t * D + c]);
    }
    if (me.world_rank == 0)
        printf("W=%d ep=%d %s cf=%g by %s: capacity %d, rank 0 received %d rows\n", me.world_size, me.ep_size,
               skewed ? "skewed " : "uniform", cf, prio == MOE_DROP_BY_SCORE ? "score" : "token", counts.capacity,
               plan.num_recv);
    if (skewed && me.ep_rank > 0) CHECK(plan.num_recv == 0, "skewed: EP rank %d received rows", me.ep_rank);
    free(x), free(xp), free(back), free(sum), free(staging), free(rows);
    free(expert), free(slot), free(perm_token), free(score), free(kept);
    free(o.first_token), free(o.expert), free(o.kept);
    moe_dispatch_plan_free(&plan);
    moe_routing_counts_free(&counts);
}

/* moe_parallel_set_timeout reaches every communicator of the layout and gives back the watchdog it replaced (a
 * checkpoint's file work runs under --checkpoint-timeout this way, then puts the exchange watchdog back). */
static void check_set_timeout(const moe_parallel *par) {
    moe_comm *const all[] = {moe_parallel_world(par), moe_parallel_stage(par), moe_parallel_pipeline(par),
                             moe_parallel_ep(par), moe_parallel_expert_dp(par), moe_parallel_tensor(par),
                             moe_parallel_data(par)};
    const int n = (int)(sizeof all / sizeof all[0]);
    CHECK(moe_parallel_set_timeout(par, 3600) == 60, "the layout's watchdog before: 60 s");
    for (int i = 0; i < n; i++)
        CHECK(moe_comm_timeout(all[i]) == 3600, "communicator %d: %g s", i, moe_comm_timeout(all[i]));
    CHECK(moe_parallel_set_timeout(par, 60) == 3600, "the checkpoint timeout given back");
    for (int i = 0; i < n; i++)
        CHECK(moe_comm_timeout(all[i]) == 60, "communicator %d put back: %g s", i, moe_comm_timeout(all[i]));
}

/* Rows a rank sends itself must be the rows it expects from itself: a disagreement (a layout bug upstream) is refused
 * on that rank before anything moves, not copied past the receive buffer (mutation testing, 2026-12-08: the check
 * removed, 2 rows landed where 1 was expected). Every rank gives the same counts, so every rank refuses alike. */
static void check_self_rows(const moe_parallel *par) {
    moe_comm *c = moe_parallel_world(par);
    const int W = moe_comm_size(c), me = moe_comm_rank(c);
    int *send_rows = calloc((size_t)W, sizeof(int)), *recv_rows = calloc((size_t)W, sizeof(int));
    float send[2] = {1, 2}, recv[2] = {-1, -1};
    send_rows[me] = 2, recv_rows[me] = 1;
    const moe_status st = moe_comm_alltoallv_rows(c, send, send_rows, recv, recv_rows, sizeof(float));
    CHECK(st == MOE_ERR_INVALID_ARG && strstr(moe_failure_message(st), "2 rows to itself but 1 expected"),
          "rows to itself disagreeing: status %d (%s)", (int)st, moe_failure_message(st));
    CHECK(recv[1] == -1, "the refused exchange wrote past the rows expected");
    free(send_rows), free(recv_rows);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int W;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    for (int ep = 1; ep <= W; ep++) {
        if (W % ep || E % ep) continue;
        moe_parallel *par;
        test_mpi_require(moe_parallel_create_mpi(MPI_COMM_WORLD, ep, 60, &par), "parallel layout");
        check_set_timeout(par);
        if (ep == 1) check_self_rows(par);
        run_case(par, 0, 1.0f, MOE_DROP_BY_SCORE);
        run_case(par, 0, 0.75f, MOE_DROP_BY_TOKEN_ORDER);
        run_case(par, 0, 0.0f, MOE_DROP_BY_SCORE);
        run_case(par, 1, 0.0f, MOE_DROP_BY_SCORE);
        run_case(par, 1, 1.0f, MOE_DROP_BY_SCORE);
        moe_parallel_destroy(par);
    }
    return test_mpi_finish("test_alltoall_mpi");
}
