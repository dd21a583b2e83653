/* test_alltoall_mpi.c — the expert-parallel exchanges, checked exactly (DeepEP's provenance test).
 * Under mpirun -np W, for every ep dividing W: each rank routes its own (uneven) number of tokens,
 * capacity is applied globally, and payload rows encode (source world rank, token, column) as exact
 * integers. Checks: the counts each rank receives equal those derived from the global routing; every
 * received row is the expected one, in expert-major (expert, source rank, token) order; combine brings
 * back exactly what was sent; combine(dispatch(x)) with unit gates is x times each token's kept fan-out.
 * Cases: uniform random routing with drops, and a skewed one where every token picks experts 0 and 1,
 * so every other EP rank receives zero rows. */
#include <stdlib.h>
#include <string.h>

#include "alltoall/dispatch.h"
#include "alltoall/parallel_mpi.h"
#include "kernels/permute.h"
#include "moe/global_routing.h"
#include "router/layout.h"
#include "tests/test_mpi.h"

enum { E = 8, K = 2, D = 4 };

static moe_real payload(int world_rank, int token, int col) { return (moe_real)((world_rank * 1024 + token) * D + col); }

static void run_case(const moe_parallel *par, int skewed, float cf) {
    const int T = 20 + 7 * par->world_rank, EL = E / par->ep_size;
    moe_routing r;
    moe_global_routing g = {0};
    moe_dispatch_plan plan;
    test_mpi_require(moe_routing_alloc(&r, T, E, K, par->ep_size), "routing alloc");
    test_mpi_require(moe_dispatch_plan_alloc(&plan, par->ep_size, EL), "plan alloc");
    moe_rng rng = moe_rng_seeded(100 * par->world_rank + skewed);
    r.num_tokens = T;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e = skewed ? j : (int)(moe_rng_next(&rng) % E);
            while (j == 1 && e == r.expert[t * K]) e = (e + 1) % E;
            r.expert[t * K + j] = e;
            r.expert_score[t * K + j] = (moe_real)moe_rng_uniform(&rng);
        }
    test_mpi_require(moe_global_capacity(par, cf, MOE_DROP_BY_SCORE, &r, &g), "global capacity");
    moe_router_dispatch_layout_cpu(&r);

    moe_real *x = malloc((size_t)T * D * sizeof *x), *xp = malloc((size_t)T * K * D * sizeof *x);
    moe_real *back = malloc((size_t)T * K * D * sizeof *x), *sum = malloc((size_t)T * D * sizeof *x);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++) x[t * D + c] = payload(par->world_rank, t, c);
    moe_permute_rows_cpu(x, r.perm_token, r.num_kept, D, xp);

    int *expected = malloc((size_t)par->ep_size * EL * sizeof(int));
    moe_global_expected_recv_counts(par, &g, expected);
    test_mpi_require(moe_dispatch_plan_exchange(par->ep, r.num_tokens_per_expert, expected, 0, &plan), "counts");
    int want_total = 0;
    for (int i = 0; i < par->ep_size * EL; i++) want_total += expected[i];
    CHECK(plan.num_recv == want_total, "received %d rows, global routing says %d", plan.num_recv, want_total);

    size_t n = plan.num_recv ? plan.num_recv : 1;
    moe_real *staging = malloc(n * D * sizeof *x), *rows = malloc(n * D * sizeof *x);
    test_mpi_require(moe_dispatch_rows(par->ep, &plan, xp, D * sizeof(moe_real), staging, rows), "dispatch");
    /* expected order: local expert, then source rank of the EP group, then token; kept only */
    int row = 0;
    for (int le = 0; le < EL; le++)
        for (int p = 0; p < par->ep_size; p++) {
            int src = par->dp_rank * par->ep_size + p;
            for (int gt = g.first_token[src]; gt < g.first_token[src + 1]; gt++)
                for (int j = 0; j < K; j++) {
                    int a = gt * K + j;
                    if (!g.routing.kept[a] || g.routing.expert[a] != par->ep_rank * EL + le) continue;
                    int t = gt - g.first_token[src];
                    for (int c = 0; c < D && row < plan.num_recv; c++)
                        CHECK(rows[(size_t)row * D + c] == payload(src, t, c),
                              "rank %d row %d col %d: got %g, want (rank %d, token %d)", par->world_rank, row, c,
                              (double)rows[(size_t)row * D + c], src, t);
                    row++;
                }
        }
    CHECK(row == plan.num_recv, "rank %d: expected %d rows, received %d", par->world_rank, row, plan.num_recv);

    test_mpi_require(moe_combine_rows(par->ep, &plan, rows, D * sizeof(moe_real), staging, back), "combine");
    CHECK(!memcmp(back, xp, (size_t)r.num_kept * D * sizeof *x), "rank %d: combine did not return the sent rows",
          par->world_rank);
    moe_combine_rows_cpu(back, r.slot, NULL, T, K, D, sum);
    for (int t = 0; t < T; t++) {
        int fan_out = r.kept[t * K] + r.kept[t * K + 1];
        for (int c = 0; c < D; c++)
            CHECK(sum[t * D + c] == fan_out * x[t * D + c], "rank %d token %d: round trip %g, want %d x %g",
                  par->world_rank, t, (double)sum[t * D + c], fan_out, (double)x[t * D + c]);
    }
    if (par->world_rank == 0)
        printf("W=%d ep=%d %s cf=%g: capacity %d, rank 0 received %d rows\n", par->world_size, par->ep_size,
               skewed ? "skewed " : "uniform", cf, r.capacity, plan.num_recv);
    if (skewed && par->ep_rank > 0) CHECK(plan.num_recv == 0, "skewed: EP rank %d received rows", par->ep_rank);
    free(x), free(xp), free(back), free(sum), free(expected), free(staging), free(rows);
    moe_dispatch_plan_free(&plan);
    moe_global_routing_free(&g);
    moe_routing_free(&r);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int W;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    for (int ep = 1; ep <= W; ep++) {
        if (W % ep || E % ep) continue;
        moe_parallel *par;
        test_mpi_require(moe_parallel_create_mpi(MPI_COMM_WORLD, ep, 60, &par), "parallel layout");
        run_case(par, 0, 1.0f);
        run_case(par, 0, 0.0f);
        run_case(par, 1, 0.0f);
        moe_parallel_destroy(par);
    }
    return test_mpi_finish("test_alltoall_mpi");
}
