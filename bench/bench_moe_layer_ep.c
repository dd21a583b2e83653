/* bench_moe_layer_ep.c — one training step of the MoE layer under expert parallelism, on one machine.
 *
 * Under mpirun -np W with --ep EP (dp = W/EP): the global batch of --tokens-global tokens is split over the
 * W ranks in rank order (the first T % W ranks get one token more), each rank holds E/EP experts. The global
 * weights come from moe_layer_weights_init with --seed on the unsharded config; each rank keeps the router
 * and its experts' slice, so every layout computes the same model on the same batch (with
 * --layout-invariant 1 the printed checksum is the same for every W and EP up to the order of its final sum).
 * One step = moe_layer_forward + moe_layer_backward + moe_layer_reduce_gradients (gradients zeroed before
 * it, untimed), after an MPI_Barrier (untimed). Reported: the max over ranks of each rank's median step time
 * (and of its forward, backward and reduce parts), tokens/s = global tokens / that time, and the time spent
 * inside the exchanges, measured by the communicators' exchange timing (alltoall/comm_timing.h) of the three
 * communicators (world, ep, expert-dp): dispatch+combine payload (alltoallv), counts (alltoall),
 * global routing (allgather), allreduce (losses, gradients). Exchange times include waiting for slower
 * peers (load imbalance) and, with more ranks than cores, time descheduled. Last line: "json: {...}".
 *
 *   meson setup build-bench --buildtype=release && ninja -C build-bench bench/bench_moe_layer_ep
 *   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
 *   OMPI_MCA_btl_vader_single_copy_mechanism=none OPENBLAS_NUM_THREADS=1 \
 *   mpirun -np 4 build-bench/bench/bench_moe_layer_ep --ep 2 [--tokens-global 4096 --d-model 512 --d-ff 1024
 *       --experts 8 --top-k 2 --capacity-factor 0 --layout-invariant 1 --warmup 1 --iters 5 --seed 1234]
 * For W = 1 with 2 OpenBLAS threads add `--bind-to none`: mpirun binds 1 or 2 ranks to one core each, and
 * OpenBLAS then caps itself at 1 thread (the first line prints the threads it actually uses).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_timing.h"
#include "alltoall/parallel_mpi.h"
#include "bench/bench_util_mpi.h"
#include "core/rng.h"

typedef struct {
    int ep, tokens, d_model, d_ff, experts, top_k, layout_invariant, warmup, iters, seed;
    double capacity_factor, timeout_s;
} options;

static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np W bench_moe_layer_ep --ep EP [--tokens-global N] [--d-model N] [--d-ff N]\n"
               "           [--experts N] [--top-k N] [--capacity-factor X] [--layout-invariant 0|1]\n"
               "           [--warmup N] [--iters N] [--seed N] [--timeout SECONDS]\n"
               "  EP must divide W and --experts; defaults: --ep 1 --tokens-global 4096 --d-model 512 --d-ff 1024\n"
               "  --experts 8 --top-k 2 --capacity-factor 0 (dropless) --layout-invariant 1 --warmup 1 --iters 5\n"
               "  --seed 1234 --timeout 300\n");
}

/* Every rank parses the same arguments, so every rank reaches the same usage error (bench_util.h). */
static options parse_args(int argc, char **argv, int W) {
    options o = {1, 4096, 512, 1024, 8, 2, 1, 1, 5, 1234, 0.0, 300};
    for (int i = 1; i < argc; i++) {
        const bench_flag fl = bench_next_flag(argc, argv, &i);
        const char *name = fl.name, *val = fl.value;
        if (!strcmp(name, "--ep")) o.ep = bench_parse_int(name, val, 1, 4096);
        else if (!strcmp(name, "--tokens-global")) o.tokens = bench_parse_int(name, val, 1, 1 << 22);
        else if (!strcmp(name, "--d-model")) o.d_model = bench_parse_int(name, val, 1, 1 << 16);
        else if (!strcmp(name, "--d-ff")) o.d_ff = bench_parse_int(name, val, 1, 1 << 17);
        else if (!strcmp(name, "--experts")) o.experts = bench_parse_int(name, val, 1, 4096);
        else if (!strcmp(name, "--top-k")) o.top_k = bench_parse_int(name, val, 1, 4096);
        else if (!strcmp(name, "--layout-invariant")) o.layout_invariant = bench_parse_int(name, val, 0, 1);
        else if (!strcmp(name, "--warmup")) o.warmup = bench_parse_int(name, val, 0, 100000);
        else if (!strcmp(name, "--iters")) o.iters = bench_parse_int(name, val, 1, 100000);
        else if (!strcmp(name, "--seed")) o.seed = bench_parse_int(name, val, 0, 1L << 30);
        else if (!strcmp(name, "--timeout")) o.timeout_s = bench_parse_int(name, val, 1, 86400);
        else if (!strcmp(name, "--capacity-factor"))
            o.capacity_factor = bench_parse_real(
                val, 0, 1e6, "--capacity-factor must be a finite number in [0, 1e6] (0 = dropless)");
        else bench_usage_error("unknown flag", name);
    }
    if (W % o.ep) bench_usage_errorf("--ep %d does not divide the world size %d", o.ep, W);
    if (o.experts % o.ep) bench_usage_errorf("--ep %d does not divide --experts %d", o.ep, o.experts);
    if (o.top_k > o.experts) bench_usage_error("--top-k must not exceed --experts", NULL);
    if (o.tokens < W) bench_usage_errorf("--tokens-global must be at least W = %d", W);
    double biggest = (double)o.tokens * o.top_k * (o.d_ff > o.d_model ? o.d_ff : o.d_model);
    if ((double)o.tokens * o.top_k > 1 << 30 || biggest * sizeof(moe_real) > 8e9)
        bench_usage_error("shape too large (activations over 8 GB)", NULL);
    return o;
}

/* Timing of the exchanges: the three communicators add their wall time per kind into one table. */
enum { NCAT = MOE_EXCHANGE_KINDS };
static moe_exchange_times times;

static void time_exchanges(moe_parallel *par) {
    moe_comm_time_exchanges(moe_parallel_world(par), &times);
    moe_comm_time_exchanges(moe_parallel_ep(par), &times);
    moe_comm_time_exchanges(moe_parallel_expert_dp(par), &times);
}

static moe_real *alloc(size_t n) {
    moe_real *p = calloc(n ? n : 1, sizeof *p);
    if (!p) bench_fail("out of memory");
    return p;
}

/* per-step series: step, its parts, all exchanges together, then each category of exchange */
enum { S_STEP, S_FWD, S_BWD, S_REDUCE, S_COMM, S_CAT, NSER = S_CAT + NCAT };
enum { C_PAYLOAD = MOE_EXCHANGE_PAYLOAD, C_COUNTS = MOE_EXCHANGE_COUNTS, C_ROUTING = MOE_EXCHANGE_ROUTING,
       C_ALLREDUCE = MOE_EXCHANGE_ALLREDUCE };

int main(int argc, char **argv) {
    int W;
    const int my_rank = bench_mpi_init(&argc, &argv, "bench_moe_layer_ep", usage, &W);
    const options o = parse_args(argc, argv, W);
    const int TG = o.tokens, d = o.d_model, f = o.d_ff, E = o.experts, N = o.iters;
    moe_config cfg = moe_config_default(d, f, E, o.top_k);
    cfg.capacity_factor = (float)o.capacity_factor;
    cfg.layout_invariant = o.layout_invariant;
    cfg.ep_size = o.ep;
    const char *problem = moe_config_problem(&cfg);
    if (problem) bench_usage_error("invalid MoE config", problem);

    moe_parallel *par;
    bench_check(moe_parallel_create_mpi(MPI_COMM_WORLD, o.ep, o.timeout_s, &par), "moe_parallel_create_mpi");
    const int EL = E / o.ep, first = my_rank * (TG / W) + (my_rank < TG % W ? my_rank : TG % W);
    const moe_ranks ranks = moe_parallel_ranks(par);
    const int T = TG / W + (my_rank < TG % W);

    /* The global model and batch on every rank, from the seed; this rank keeps its share. */
    moe_config gcfg = cfg;
    gcfg.ep_size = 1;
    moe_rng rng = moe_rng_seeded((uint64_t)o.seed);
    size_t GP = moe_layer_num_params(&gcfg), P = moe_layer_num_params(&cfg), Td = (size_t)T * d;
    moe_real *gbuf = alloc(GP), *wbuf = alloc(P), *grad = alloc(P);
    moe_layer_weights gw = moe_layer_weights_view(&gcfg, gbuf), w = moe_layer_weights_view(&cfg, wbuf);
    moe_layer_weights g = moe_layer_weights_view(&cfg, grad);
    moe_layer_weights_init(&gcfg, &gw, &rng);
    const size_t expert_n = (size_t)EL * f * d, skip = (size_t)ranks.ep_rank * expert_n;
    memcpy(w.router_w, gw.router_w, (size_t)E * d * sizeof(moe_real));
    memcpy(w.w1, gw.w1 + skip, expert_n * sizeof(moe_real));
    memcpy(w.w3, gw.w3 + skip, expert_n * sizeof(moe_real));
    memcpy(w.w2, gw.w2 + skip, expert_n * sizeof(moe_real));
    free(gbuf);
    moe_real *gx = alloc((size_t)TG * d), *x = alloc(Td), *dout = alloc(Td), *out = alloc(Td), *dx = alloc(Td);
    moe_rng_fill_uniform(&rng, gx, (size_t)TG * d, 1.0);
    memcpy(x, gx + (size_t)first * d, Td * sizeof *x);
    moe_rng_fill_uniform(&rng, gx, (size_t)TG * d, 1.0);
    memcpy(dout, gx + (size_t)first * d, Td * sizeof *x);
    free(gx);

    moe_layer *layer;
    bench_check(moe_layer_create(&cfg, NULL, par, &layer), "moe_layer_create");
    time_exchanges(par);
    moe_layer_stats stats;
    double *series = malloc((size_t)NSER * N * sizeof *series), med[NSER], slowest[NSER];
    if (!series) bench_fail("out of memory");
    for (int it = -o.warmup; it < N; it++) {
        memset(grad, 0, P * sizeof *grad);
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        memset(&times, 0, sizeof times);
        double t0 = MPI_Wtime();
        bench_check(moe_layer_forward(layer, &w, x, T, out, &stats), "moe_layer_forward");
        double t1 = MPI_Wtime();
        bench_check(moe_layer_backward(layer, &w, dout, dx, &g), "moe_layer_backward");
        double t2 = MPI_Wtime();
        bench_check(moe_layer_reduce_gradients(layer, &g), "moe_layer_reduce_gradients");
        double t3 = MPI_Wtime();
        if (it < 0) continue;
        double v[NSER] = {t3 - t0, t1 - t0, t2 - t1, t3 - t2, 0};
        for (int c = 0; c < NCAT; c++) v[S_COMM] += v[S_CAT + c] = times.seconds[c];
        for (int s = 0; s < NSER; s++) series[(size_t)s * N + it] = v[s] * 1e3; /* ms */
    }
    for (int s = 0; s < NSER; s++) med[s] = bench_median(series + (size_t)s * N, N);
    MPI_CHECK(MPI_Allreduce(med, slowest, NSER, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));

    /* What the last step did, summed (or spread) over the ranks. */
    double local[2] = {0, stats.num_dropped}, global[2];
    for (size_t i = 0; i < Td; i++) local[0] += (double)out[i] + dx[i];
    MPI_CHECK(MPI_Allreduce(local, global, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    int rows[2] = {stats.num_rows_received, -stats.num_rows_received}, rows_max[2];
    MPI_CHECK(MPI_Allreduce(rows, rows_max, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    const double comm_total = slowest[S_COMM];

    if (my_rank == 0) {
        const double step = slowest[S_STEP], tps = TG / (step * 1e-3);
        const char *env = getenv("OPENBLAS_NUM_THREADS"); /* mpirun's binding to a core can cap threads at 1 */
        printf("openblas: threads=%d per rank (OPENBLAS_NUM_THREADS=%s) corename=%s  W=%d ep=%d dp=%d  experts/rank %d\n",
               openblas_get_num_threads(), env ? env : "(unset)", openblas_get_corename(), W, o.ep, W / o.ep, EL);
        printf("shape: tokens_global=%d (%d..%d per rank) d=%d d_ff=%d E=%d k=%d capacity_factor=%g (%s) "
               "layout_invariant=%d warmup=%d iters=%d seed=%d\n", TG, TG / W, TG / W + (TG % W != 0), d, f, E,
               o.top_k, o.capacity_factor, o.capacity_factor > 0 ? "capacity" : "dropless", o.layout_invariant,
               o.warmup, N, o.seed);
        printf("last step: rows received per rank %d..%d, dropped %.0f, aux_loss %.6f, checksum(out+dx) %.6e\n",
               -rows_max[1], rows_max[0], global[1], stats.aux_loss, global[0]);
        printf("step (fwd+bwd+reduce), max over ranks of the median: %.2f ms  ->  %.0f tokens/s\n", step, tps);
        printf("  parts (each max over ranks of its median): forward %.2f ms  backward %.2f ms  reduce %.2f ms\n",
               slowest[S_FWD], slowest[S_BWD], slowest[S_REDUCE]);
        printf("  inside exchanges (incl. waiting for peers): payload %.2f  counts %.2f  routing %.2f  "
               "allreduce %.2f ms; all %.2f ms (%.1f%% of the step)\n", slowest[S_CAT + C_PAYLOAD],
               slowest[S_CAT + C_COUNTS], slowest[S_CAT + C_ROUTING],
               slowest[S_CAT + C_ALLREDUCE], comm_total, 100 * comm_total / step);
        printf("json: {\"bench\":\"moe_layer_ep\",\"world\":%d,\"ep\":%d,\"dp\":%d,\"openblas_threads\":%d,"
               "\"tokens_global\":%d,\"d_model\":%d,\"d_ff\":%d,\"experts\":%d,\"top_k\":%d,\"capacity_factor\":%g,"
               "\"layout_invariant\":%d,\"warmup\":%d,\"iters\":%d,\"seed\":%d,\"step_ms\":%.4f,\"tokens_per_s\":%.1f,"
               "\"forward_ms\":%.4f,\"backward_ms\":%.4f,\"reduce_ms\":%.4f,\"exchange_ms\":{",
               W, o.ep, W / o.ep, openblas_get_num_threads(), TG, d, f, E, o.top_k, o.capacity_factor,
               o.layout_invariant, o.warmup, N, o.seed, step, tps, slowest[S_FWD], slowest[S_BWD], slowest[S_REDUCE]);
        for (int c = 0; c < NCAT; c++) printf("\"%s\":%.4f,", moe_exchange_kind_name(c), slowest[S_CAT + c]);
        printf("\"all\":%.4f},\"rows_received_min\":%d,\"rows_received_max\":%d,\"dropped\":%.0f,\"checksum\":%.9e}\n",
               comm_total, -rows_max[1], rows_max[0], global[1], global[0]);
    }
    moe_layer_destroy(layer);
    moe_parallel_destroy(par);
    free(series), free(wbuf), free(grad), free(x), free(dout), free(out), free(dx);
    MPI_CHECK(MPI_Finalize());
    return 0;
}
