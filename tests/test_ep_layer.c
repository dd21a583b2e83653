/* test_ep_layer.c — layout invariance of the MoE layer under expert parallelism.
 * Under mpirun -np W, for every ep dividing W (and E): a fixed global batch and fixed global weights are
 * split over the ranks (uneven token counts), each rank holds its E/ep experts, and the results are
 * compared with a single-rank run of the same layer on the whole batch, computed in-process as the
 * reference. Bitwise (memcmp): routing, kept/dropped sets, outputs, input gradients — row-wise GEMMs run in
 * fixed-shape blocks (kernels/gemm_rows.h) and every row travels and combines in a fixed order. Within 1e-6
 * relative of the single-rank run, for W > 1: router and expert weight gradients (sums of per-rank
 * partial products instead of one product over all rows), and the aux/z loss values (1e-12; double
 * partial sums per rank). Across layouts of the same W = 2, the expert gradients of ep = 1 (replicated,
 * summed by the all-reduce) and ep = 2 (sharded, summed per source rank) are bitwise equal
 * (experts/expert_ffn.h); at W = 4 they are within 1e-6. Cases: softmax with drops by token order, sigmoid with a selection bias and
 * drops by score, and a skewed router that sends every token to experts 0 and 1 (other EP ranks get 0 rows:
 * their empty blocks come with NULL buffers, so under scripts/sanitize.sh this case is the regression check of
 * D10, a memmove(NULL, NULL, 0) in dispatch.c's move_blocks that UBSan reports as a null argument). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/parallel_mpi.h"
#include "moe/layer_internal.h"
#include "tests/test_mpi.h"

enum { TG = 150, D = 32, F = 48, E = 8, K = 2 };

typedef struct {
    const char *name;
    moe_score_func func;
    float cf;
    moe_drop_priority prio;
    int skewed;
} ep_case;

static double max_rel_diff(const moe_real *a, const moe_real *b, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return scale > 0 ? diff / scale : diff;
}

/* bitwise, or within 1e-6 relative when `exact` is 0 */
static void compare(const char *what, int exact, const moe_real *got, const moe_real *want, size_t n, int rank) {
    double rel = max_rel_diff(got, want, n);
    if (exact)
        CHECK(!memcmp(got, want, n * sizeof *got), "rank %d: %s not bitwise equal (max rel diff %.3g)", rank, what,
              rel);
    else
        CHECK(rel <= 1e-6, "rank %d: %s max rel diff %.3g > 1e-6", rank, what, rel);
}

/* Gathers this rank's expert gradients over its EP group into the global [w1 | w3 | w2] of all E experts. */
static moe_real *global_expert_grads(const moe_parallel *par, const moe_layer_weights *g, size_t per_rank) {
    const int ep = moe_parallel_ranks(par).ep_size;
    moe_real *global = malloc(3 * per_rank * ep * sizeof(moe_real));
    size_t nbytes[16]; /* ep <= 8 here */
    for (int p = 0; p < ep; p++) nbytes[p] = per_rank * sizeof(moe_real);
    const moe_real *parts[3] = {g->w1, g->w3, g->w2};
    for (int w = 0; w < 3; w++)
        test_mpi_require(moe_comm_allgatherv_bytes(moe_parallel_ep(par), parts[w], nbytes[0], global + w * per_rank * ep,
                                                   nbytes),
                         "gather expert gradients");
    return global;
}

/* Returns the global expert gradients of this layout (for the cross-layout comparison). */
static moe_real *run_case(const moe_parallel *par, const ep_case *c) {
    const moe_ranks me = moe_parallel_ranks(par);
    moe_config cfg = moe_config_default(D, F, E, K);
    cfg.score_func = c->func, cfg.capacity_factor = c->cf, cfg.drop_priority = c->prio;
    cfg.aux_loss_coef = 0.1f, cfg.z_loss_coef = 0.01f;
    const int W = me.world_size, rank = me.world_rank, EL = moe_config_num_local_experts(&cfg, me.ep_size);

    /* The global problem, the same on every rank. */
    moe_rng rng = moe_rng_seeded(77);
    test_weights ref_w = test_weights_random(&cfg, 1, &rng), ref_g = test_weights_zero(&cfg, 1);
    moe_real *x = test_alloc_uniform(&rng, TG * D, 1.0), *dout = test_alloc_uniform(&rng, TG * D, 1.0);
    moe_real bias[E];
    moe_rng_fill_uniform(&rng, bias, E, c->func == MOE_SCORE_SIGMOID ? 0.3 : 0);
    if (c->skewed)
        for (int i = 0; i < E * D; i++) {
            if (i % D == 0) ref_w.w.router_w[i] = i / D < 2 ? 8 : 0;
            if (i < TG) x[i * D] = 1;
        }
    moe_real *ref_out = test_alloc_uniform(&rng, TG * D, 0), *ref_dx = test_alloc_uniform(&rng, TG * D, 0);
    moe_layer *ref;
    moe_layer_stats ref_st;
    test_mpi_require(moe_layer_create(&cfg, NULL, NULL, &ref), "reference create");
    memcpy(moe_layer_expert_bias(ref), bias, sizeof bias);
    test_mpi_require(moe_layer_forward(ref, &ref_w.w, x, TG, ref_out, &ref_st), "reference forward");
    test_mpi_require(moe_layer_backward(ref, &ref_w.w, dout, ref_dx, &ref_g.w), "reference backward");
    const moe_token_routing *ref_r = moe__layer_token_routing(ref);

    /* This rank's share: uneven slices of the global batch, its experts' weights. */
    int first = rank * TG / W + (rank > 0 ? 3 : 0), last = (rank + 1) * TG / W + (rank + 1 < W ? 3 : 0);
    int T = last - first;
    test_weights w = test_weights_zero(&cfg, me.ep_size), g = test_weights_zero(&cfg, me.ep_size);
    size_t expert_count = (size_t)EL * F * D, first_expert = (size_t)me.ep_rank * EL * F * D;
    memcpy(w.w.router_w, ref_w.w.router_w, (size_t)E * D * sizeof(moe_real));
    memcpy(w.w.w1, ref_w.w.w1 + first_expert, expert_count * sizeof(moe_real));
    memcpy(w.w.w3, ref_w.w.w3 + first_expert, expert_count * sizeof(moe_real));
    memcpy(w.w.w2, ref_w.w.w2 + first_expert, expert_count * sizeof(moe_real));
    moe_real *out = test_alloc_uniform(&rng, T * D, 0), *dx = test_alloc_uniform(&rng, T * D, 0);
    moe_layer *L;
    moe_layer_stats st;
    test_mpi_require(moe_layer_create(&cfg, NULL, par, &L), "create");
    memcpy(moe_layer_expert_bias(L), bias, sizeof bias);
    test_mpi_require(moe_layer_forward(L, &w.w, x + (size_t)first * D, T, out, &st), "forward");
    test_mpi_require(moe_layer_backward(L, &w.w, dout + (size_t)first * D, dx, &g.w), "backward");
    test_mpi_require(moe_layer_reduce_gradients(L, &g.w), "reduce gradients");
    const moe_token_routing *r = moe__layer_token_routing(L);

    CHECK(!memcmp(r->expert, ref_r->expert + (size_t)first * K, (size_t)T * K * sizeof(int)),
          "rank %d: routing differs", rank);
    CHECK(!memcmp(r->kept, ref_r->kept + (size_t)first * K, (size_t)T * K), "rank %d: dropped sets differ", rank);
    CHECK(st.capacity == ref_st.capacity && st.num_tokens_global == TG, "rank %d: capacity %d vs %d", rank, st.capacity,
          ref_st.capacity);
    compare("output", 1, out, ref_out + (size_t)first * D, (size_t)T * D, rank);
    compare("input gradient", 1, dx, ref_dx + (size_t)first * D, (size_t)T * D, rank);
    compare("router gradient", W == 1, g.w.router_w, ref_g.w.router_w, (size_t)E * D, rank);
    compare("w1 gradient", W == 1, g.w.w1, ref_g.w.w1 + first_expert, expert_count, rank);
    compare("w3 gradient", W == 1, g.w.w3, ref_g.w.w3 + first_expert, expert_count, rank);
    compare("w2 gradient", W == 1, g.w.w2, ref_g.w.w2 + first_expert, expert_count, rank);
    moe_real *global = global_expert_grads(par, &g.w, expert_count);
    CHECK(fabs(st.aux_loss - ref_st.aux_loss) <= 1e-12 * ref_st.aux_loss, "rank %d: aux %.17g vs %.17g", rank,
          st.aux_loss, ref_st.aux_loss);
    CHECK(fabs(st.z_loss - ref_st.z_loss) <= 1e-12 * ref_st.z_loss, "rank %d: z %.17g vs %.17g", rank, st.z_loss,
          ref_st.z_loss);
    int dropped = 0;
    for (int a = 0; a < TG * K; a++) dropped += !ref_r->kept[a];
    if (c->cf > 0 && rank == 0) CHECK(dropped > 0, "%s: nothing dropped", c->name);
    if (c->skewed && me.ep_rank > 0)
        CHECK(st.num_rows_received == 0, "rank %d received %d rows", rank, st.num_rows_received);
    if (rank == 0)
        printf("W=%d ep=%d dp=%d %-28s dropped %3d/%d, rank 0 got %3d rows, aux %.6f z %.6f\n", W, me.ep_size,
               me.edp_size, c->name, dropped, TG * K, st.num_rows_received, st.aux_loss, st.z_loss);

    moe_layer_destroy(L), moe_layer_destroy(ref);
    test_weights_free(&w), test_weights_free(&g), test_weights_free(&ref_w), test_weights_free(&ref_g);
    free(x), free(dout), free(out), free(dx), free(ref_out), free(ref_dx);
    return global;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int W;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    const ep_case cases[] = {
        {"softmax cf=1 token-order", MOE_SCORE_SOFTMAX, 1.0f, MOE_DROP_BY_TOKEN_ORDER, 0},
        {"sigmoid+bias cf=1.25 score", MOE_SCORE_SIGMOID, 1.25f, MOE_DROP_BY_SCORE, 0},
        {"skewed to experts 0,1", MOE_SCORE_SOFTMAX, 0.0f, MOE_DROP_BY_TOKEN_ORDER, 1},
    };
    enum { NUM_CASES = sizeof cases / sizeof *cases };
    moe_real *replicated[NUM_CASES]; /* ep = 1 */
    const size_t global_count = 3 * (size_t)E * F * D;
    for (int ep = 1; ep <= W; ep++) {
        if (W % ep || E % ep) continue;
        moe_parallel *par;
        test_mpi_require(moe_parallel_create_mpi(MPI_COMM_WORLD, ep, 60, &par), "parallel layout");
        for (int i = 0; i < NUM_CASES; i++) {
            moe_real *global = run_case(par, &cases[i]);
            if (ep == 1) {
                replicated[i] = global;
                continue;
            }
            compare("expert gradients vs ep 1", W == 2, global, replicated[i], global_count,
                    moe_parallel_ranks(par).world_rank);
            free(global);
        }
        moe_parallel_destroy(par);
    }
    for (int i = 0; i < NUM_CASES; i++) free(replicated[i]);
    return test_mpi_finish("test_ep_layer");
}
