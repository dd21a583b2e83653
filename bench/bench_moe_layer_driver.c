/* bench_moe_layer_driver.c — the driver of the MoE layer benchmarks (bench_moe_layer_driver.h), compiled into
 * bench_moe_layer, bench_moe_layer_ep, bench_moe_layer_gpu and bench_moe_layer_gpu_ep beside each one's
 * variant table. No MPI and no CUDA in here: those are the variants' business.
 *
 * Takes: the layer from moe/moe.h; the runtime's memory (alloc, upload, download, zero, synchronize) from
 * moe/runtime.h; the world communicator from alltoall/parallel.h and comm.h (barrier, sums, and the maximum
 * over ranks by an all-gather); exchange timing from alltoall/comm_timing.h.
 *
 * Per iteration (--warmup untimed, then --iters timed; CLOCK_MONOTONIC; the runtime synchronised after each
 * part, so that a GPU's queued work counts in its part):
 *   gradients zeroed, [distributed: barrier over the world]       untimed
 *   forward | backward | [distributed: moe_layer_reduce_gradients] timed each, and the exchanges inside them
 *                                                                 by kind (distributed)
 * Each rank takes the median and the minimum of each part; reported is the maximum over ranks of each (the
 * slowest rank; for one process, its own). GEMM FLOPs (summed over ranks): experts 3 GEMMs of
 * 2 * rows * d * d_ff forward with rows = kept assignments, the router 2 * T * d * E; backward twice the
 * forward. GFLOP/s = those FLOPs / that time; tokens/s = global tokens / step time.
 * Model and batch: moe_layer_weights_init(--seed) on the unsharded config, then the global x and upstream
 * gradient dout, uniform in [-1, 1), from the same generator; each rank keeps the router, its experts and
 * its slice of tokens. So every variant and layout computes the same model on the same batch (with
 * --layout-invariant 1 the checksum is the same for any W and ep, up to the order of its final sum).
 */
#include "bench/bench_moe_layer_driver.h"

#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/threads.h"

#define LAYER_FLAG(kind, name, field, ...) BENCH_##kind(name, bench_layer_options, field, __VA_ARGS__)

static const char *const kPrecisions[] = {"fp32", "bf16", NULL}; /* in moe_precision's order */

/* The common flags; the first one's name and help are the variant's (--tokens or --tokens-global). */
static const bench_flag kCommonFlags[] = {
    LAYER_FLAG(INT, "--tokens", tokens, 1, 1 << 22, "tokens in the batch"),
    LAYER_FLAG(INT, "--d-model", d_model, 1, 1 << 16, "width d of the token rows"),
    LAYER_FLAG(INT, "--d-ff", d_ff, 1, 1 << 17, "hidden width of each SwiGLU expert"),
    LAYER_FLAG(INT, "--experts", experts, 1, 4096, "experts E"),
    LAYER_FLAG(INT, "--top-k", top_k, 1, 4096, "experts per token k (at most E)"),
    LAYER_FLAG(REAL, "--capacity-factor", capacity_factor, 0, 1e6, "slots per expert ceil(cf * T * k / E); 0: dropless"),
    LAYER_FLAG(INT, "--layout-invariant", layout_invariant, 0, 1, "1: GEMMs in fixed 64-row calls, bitwise equal for any ep"),
    LAYER_FLAG(CHOICE, "--precision", precision, kPrecisions, "the experts' GEMM inputs: fp32, or bf16 (fp32 accumulation)"),
    LAYER_FLAG(INT, "--shards", shards, 0, 1 << 20, "virtual shards of the batch, summed in a fixed tree "
               "(moe-train's --world-invariant); 0: off"),
    LAYER_FLAG(INT, "--warmup", warmup, 0, 100000, "untimed iterations"),
    LAYER_FLAG(INT, "--iters", iters, 1, 100000, "timed iterations"),
    LAYER_FLAG(INT, "--seed", seed, 0, 1 << 30, "seed of the weights and the batch"),
    LAYER_FLAG(INT, "--threads", threads, 0, 4096, "CPU threads per rank (0: the CPUs this rank may use / ranks on this node)"),
};
enum { NUM_COMMON_FLAGS = sizeof kCommonFlags / sizeof kCommonFlags[0] };

static const bench_layer_variant *variant; /* this program's table (check() needs it) */
static bench_flag flags[BENCH_MAX_FLAGS];  /* common, then the variant's */
static bench_cli cli;

static moe_config config_of(const bench_layer_options *o) {
    moe_config cfg = moe_config_default(o->d_model, o->d_ff, o->experts, o->top_k);
    cfg.capacity_factor = (float)o->capacity_factor;
    cfg.layout_invariant = o->layout_invariant;
    cfg.precision = (moe_precision)o->precision;
    cfg.num_shards = o->shards;
    return cfg;
}

/* Every rank parses the same arguments, so every rank reaches the same usage error (bench_util.h). */
static void check(const void *options) {
    const bench_layer_options *o = options;
    if (o->top_k > o->experts) bench_usage_error("--top-k must not exceed --experts", NULL);
    if (o->tokens < o->world_size)
        bench_usage_errorf("%s must be at least the world size %d", variant->tokens_flag, o->world_size);
    /* the largest activation buffer is T*k*max(d, d_ff) reals; keep it (and int row counts) well in range */
    double biggest = (double)o->tokens * o->top_k * (o->d_ff > o->d_model ? o->d_ff : o->d_model);
    if ((double)o->tokens * o->top_k > 1 << 30 || biggest * sizeof(moe_real) > 16e9)
        bench_usage_error("shape too large (activations over 16 GB)", NULL);
    if (variant->check) variant->check(o);
    const moe_config cfg = config_of(o);
    const char *problem = moe_config_problem(&cfg);
    if (!problem) problem = moe_config_ep_problem(&cfg, o->ep);
    if (problem) bench_usage_error("invalid MoE config", problem);
}

static void parse(int argc, char **argv, bench_layer_options *o) {
    if (NUM_COMMON_FLAGS + variant->num_flags > BENCH_MAX_FLAGS) bench_fail("too many flags for one table");
    int n = 0;
    for (int i = 0; i < NUM_COMMON_FLAGS; i++) flags[n++] = kCommonFlags[i];
    flags[0].name = variant->tokens_flag;
    if (variant->distributed) flags[0].help = "tokens of the global batch, split over the ranks in rank order";
    for (int i = 0; i < variant->num_flags; i++) flags[n++] = variant->flags[i];
    cli = (bench_cli){.name = variant->program, .synopsis = variant->synopsis, .about = variant->about,
                      .flags = flags, .num_flags = n, .notes = variant->notes, .check = check};
    bench_parse_flags(&cli, argc, argv, o);
}

/* ---- model and batch ------------------------------------------------------------------------------------ */

static moe_real *host_reals(size_t count) {
    moe_real *p = calloc(count ? count : 1, sizeof *p);
    if (!p) bench_fail("out of memory (%zu reals on the host)", count);
    return p;
}

/* count reals of the runtime's memory (zeroed), filled from host when it is not NULL. */
static moe_real *runtime_reals(bench_layer_run *r, size_t count, const moe_real *host) {
    void *p = NULL;
    bench_check(moe_runtime_alloc(r->rt, count * sizeof(moe_real), &p), "moe_runtime_alloc");
    if (host) bench_check(moe_runtime_upload(r->rt, p, host, count * sizeof(moe_real)), "moe_runtime_upload");
    return p;
}

/* The global model and batch from the seed, on every rank; this rank keeps its share in the runtime's memory. */
static void make_model_and_batch(bench_layer_run *r) {
    const bench_layer_options *o = r->o;
    const int TG = o->tokens, W = r->ranks.world_size, me = r->ranks.world_rank, d = o->d_model;
    r->first_token = me * (TG / W) + (me < TG % W ? me : TG % W); /* the first TG % W ranks get one more */
    r->num_tokens = TG / W + (me < TG % W);

    moe_rng rng = moe_rng_seeded((uint64_t)o->seed);
    const size_t global_count = moe_layer_num_params(&r->cfg, 1), count = moe_layer_num_params(&r->cfg, o->ep);
    moe_real *global = host_reals(global_count), *mine = global;
    moe_layer_weights gw = moe_layer_weights_view(&r->cfg, 1, global);
    moe_layer_weights_init(&r->cfg, 1, &gw, &rng);
    if (o->ep > 1) { /* the router and this rank's experts ([router | w1 | w3 | w2], parallel.h) */
        mine = host_reals(count);
        moe_layer_weights w = moe_layer_weights_view(&r->cfg, o->ep, mine);
        const size_t expert_n = (size_t)(o->experts / o->ep) * o->d_ff * d, skip = (size_t)r->ranks.ep_rank * expert_n;
        memcpy(w.router_w, gw.router_w, (size_t)o->experts * d * sizeof(moe_real));
        memcpy(w.w1, gw.w1 + skip, expert_n * sizeof(moe_real));
        memcpy(w.w3, gw.w3 + skip, expert_n * sizeof(moe_real));
        memcpy(w.w2, gw.w2 + skip, expert_n * sizeof(moe_real));
    }
    r->weights = runtime_reals(r, count, mine);
    r->grads = runtime_reals(r, count, NULL);
    r->w = moe_layer_weights_view(&r->cfg, o->ep, r->weights);
    r->w.version = 1; /* no optimizer: one set of values, whose bf16 copies a CPU layer makes once (core/types.h) */
    r->g = moe_layer_weights_view(&r->cfg, o->ep, r->grads);
    if (mine != global) free(mine);
    free(global);

    const size_t global_td = (size_t)TG * d, td = (size_t)r->num_tokens * d, first = (size_t)r->first_token * d;
    moe_real *batch = host_reals(global_td);
    moe_rng_fill_uniform(&rng, batch, global_td, 1.0);
    r->x = runtime_reals(r, td, batch + first);
    moe_rng_fill_uniform(&rng, batch, global_td, 1.0);
    r->dout = runtime_reals(r, td, batch + first);
    free(batch);
    r->out = runtime_reals(r, td, NULL);
    r->dx = runtime_reals(r, td, NULL);
}

/* ---- timing --------------------------------------------------------------------------------------------- */

static void time_exchanges(const moe_parallel *par, moe_exchange_times *times) {
    moe_comm_time_exchanges(moe_parallel_world(par), times);
    moe_comm_time_exchanges(moe_parallel_ep(par), times);
    moe_comm_time_exchanges(moe_parallel_expert_dp(par), times);
}

static void synchronize(bench_layer_run *r) { bench_check(moe_runtime_synchronize(r->rt), "moe_runtime_synchronize"); }

/* series[s * iters + it]: ms of part s in timed iteration it. */
static void time_layer(bench_layer_run *r, double *series) {
    const int N = r->o->iters, distributed = variant->distributed;
    const size_t grad_nbytes = moe_layer_num_params(&r->cfg, r->o->ep) * sizeof(moe_real);
    moe_exchange_times times;
    if (distributed) time_exchanges(r->par, &times);
    for (int it = -r->o->warmup; it < N; it++) {
        bench_check(moe_runtime_zero(r->rt, r->grads, grad_nbytes), "moe_runtime_zero"); /* once per training step */
        synchronize(r);
        if (distributed) bench_check(moe_comm_barrier(moe_parallel_world(r->par)), "moe_comm_barrier");
        memset(&times, 0, sizeof times);
        const double t0 = bench_now_ms();
        bench_check(moe_layer_forward(r->layer, &r->w, r->x, r->num_tokens, r->out, &r->stats), "moe_layer_forward");
        synchronize(r);
        const double t1 = bench_now_ms();
        bench_check(moe_layer_backward(r->layer, &r->w, r->dout, r->dx, &r->g), "moe_layer_backward");
        synchronize(r);
        const double t2 = bench_now_ms();
        if (distributed) {
            bench_check(moe_layer_reduce_gradients(r->layer, &r->g), "moe_layer_reduce_gradients");
            synchronize(r);
        }
        const double t3 = bench_now_ms();
        if (it < 0) continue;
        double v[BENCH_LAYER_SERIES] = {[BENCH_LAYER_FORWARD] = t1 - t0, [BENCH_LAYER_BACKWARD] = t2 - t1,
                                        [BENCH_LAYER_FWD_BWD] = t2 - t0, [BENCH_LAYER_REDUCE] = t3 - t2,
                                        [BENCH_LAYER_STEP] = t3 - t0};
        for (int k = 0; k < MOE_EXCHANGE_KINDS; k++)
            v[BENCH_LAYER_EXCHANGE_ALL] += v[BENCH_LAYER_EXCHANGE + k] = times.seconds[k] * 1e3;
        for (int s = 0; s < BENCH_LAYER_SERIES; s++) series[(size_t)s * N + it] = v[s];
    }
    if (distributed) time_exchanges(r->par, NULL);
}

/* v[i] = its maximum over the ranks, on every rank (an all-gather: communicators have no max). */
static void max_over_ranks(const bench_layer_run *r, double *v, int n) {
    const int W = r->ranks.world_size;
    double *all = malloc((size_t)W * n * sizeof *all);
    size_t *nbytes = malloc((size_t)W * sizeof *nbytes);
    if (!all || !nbytes) bench_fail("out of memory");
    for (int p = 0; p < W; p++) nbytes[p] = (size_t)n * sizeof *v;
    bench_check(moe_comm_allgatherv_bytes(moe_parallel_world(r->par), v, (size_t)n * sizeof *v, all, nbytes),
                "moe_comm_allgatherv_bytes");
    for (int p = 0; p < W; p++)
        for (int i = 0; i < n; i++) v[i] = all[(size_t)p * n + i] > v[i] ? all[(size_t)p * n + i] : v[i];
    free(all), free(nbytes);
}

/* ---- report --------------------------------------------------------------------------------------------- */

/* What the last forward did, over the world: [E kept per expert | assignments | dropped | checksum]. */
enum { SUM_ASSIGNMENTS, SUM_DROPPED, SUM_CHECKSUM, NUM_SUMS };

static void sum_over_ranks(bench_layer_run *r, double *sums /* [E + NUM_SUMS] */) {
    const int E = r->o->experts;
    const size_t td = (size_t)r->num_tokens * r->o->d_model;
    moe_real *out = host_reals(td), *dx = host_reals(td);
    bench_check(moe_runtime_download(r->rt, out, r->out, td * sizeof *out), "moe_runtime_download");
    bench_check(moe_runtime_download(r->rt, dx, r->dx, td * sizeof *dx), "moe_runtime_download");
    double checksum = 0;
    for (size_t i = 0; i < td; i++) checksum += (double)out[i] + dx[i];
    free(out), free(dx);
    for (int e = 0; e < E; e++) sums[e] = r->stats.num_tokens_per_expert[e];
    sums[E + SUM_ASSIGNMENTS] = r->stats.num_assignments;
    sums[E + SUM_DROPPED] = r->stats.num_dropped;
    sums[E + SUM_CHECKSUM] = checksum;
    bench_check(moe_comm_allreduce_sum_f64(moe_parallel_world(r->par), sums, (size_t)E + NUM_SUMS),
                "moe_comm_allreduce_sum_f64");
}

static void print_shape(const bench_layer_run *r) {
    const bench_layer_options *o = r->o;
    const char *mode = o->capacity_factor > 0 ? "capacity" : "dropless";
    const int TG = o->tokens, W = r->ranks.world_size;
    if (variant->distributed) printf("shape: tokens_global=%d (%d..%d per rank)", TG, TG / W, TG / W + (TG % W != 0));
    else printf("shape: T=%d", TG);
    printf(" d=%d d_ff=%d E=%d k=%d capacity_factor=%g (%s) layout_invariant=%d precision=%s warmup=%d iters=%d "
           "seed=%d threads=%d\n",
           o->d_model, o->d_ff, o->experts, o->top_k, o->capacity_factor, mode, o->layout_invariant,
           kPrecisions[o->precision], o->warmup, o->iters, o->seed, moe_threads_get());
}

static void print_time(const char *label, const bench_layer_run *r, int s, double flop) {
    printf("%s: median %8.2f ms  min %8.2f ms  %7.1f GFLOP/s\n", label, r->median_ms[s], r->min_ms[s],
           flop / r->median_ms[s] * 1e-6);
}

static void json_time(const char *name, const bench_layer_run *r, int s) {
    printf(",\"%s\":{\"median\":%.4f,\"min\":%.4f}", name, r->median_ms[s], r->min_ms[s]);
}

/* Rank 0: the common lines, the variant's, and the JSON line. rows[2]: the fewest and most rows an EP rank's
 * experts received. */
static void report(bench_layer_run *r, const double *sums, const int *rows) {
    const bench_layer_options *o = r->o;
    const int E = o->experts;
    const double kept = r->rows_kept;
    const double flop_total = r->flop_forward + r->flop_backward;
    printf("rows per expert:");
    for (int e = 0; e < E; e++) printf(" %.0f", sums[e]);
    printf("  (kept %.0f of %.0f, dropped %.0f)\n", kept, sums[E + SUM_ASSIGNMENTS], sums[E + SUM_DROPPED]);
    if (variant->distributed) printf("rows received per rank: %d..%d\n", rows[0], rows[1]);
    printf("losses: aux=%.6f z=%.6f  checksum(out+dx)=%.6e\n", r->stats.aux_loss, r->stats.z_loss,
           sums[E + SUM_CHECKSUM]);
    printf("GEMM GFLOP per iteration: forward %.3f (experts %.3f + router %.4f), backward %.3f, total %.3f\n",
           r->flop_forward * 1e-9, r->flop_experts_forward * 1e-9, r->flop_router_forward * 1e-9,
           r->flop_backward * 1e-9, flop_total * 1e-9);
    print_time("layer forward ", r, BENCH_LAYER_FORWARD, r->flop_forward);
    print_time("layer backward", r, BENCH_LAYER_BACKWARD, r->flop_backward);
    print_time("layer fwd+bwd ", r, BENCH_LAYER_FWD_BWD, flop_total);
    const double step = r->median_ms[BENCH_LAYER_STEP], tokens_per_s = o->tokens / (step * 1e-3);
    const double *ex = r->median_ms + BENCH_LAYER_EXCHANGE;
    if (variant->distributed) {
        printf("layer reduce  : median %8.2f ms  min %8.2f ms\n", r->median_ms[BENCH_LAYER_REDUCE],
               r->min_ms[BENCH_LAYER_REDUCE]);
        printf("step (fwd+bwd+reduce), max over ranks of the median: %.2f ms  ->  %.0f tokens/s\n", step, tokens_per_s);
        printf("  inside exchanges (incl. waiting for peers): payload %.2f  counts %.2f  routing %.2f  allreduce %.2f "
               "ms; all %.2f ms (%.1f%% of the step)\n", ex[MOE_EXCHANGE_PAYLOAD], ex[MOE_EXCHANGE_COUNTS],
               ex[MOE_EXCHANGE_ROUTING], ex[MOE_EXCHANGE_ALLREDUCE], r->median_ms[BENCH_LAYER_EXCHANGE_ALL],
               100 * r->median_ms[BENCH_LAYER_EXCHANGE_ALL] / step);
    }
    if (variant->report) variant->report(r);

    printf("json: {\"bench\":");
    bench_json_string(variant->bench);
    printf(",");
    bench_json_flags(o);
    printf(",\"world\":%d,\"dp\":%d,\"rows\":%.0f,\"dropped\":%.0f,\"aux_loss\":%.6f,\"z_loss\":%.6f,\"checksum\":%.9e",
           r->ranks.world_size, r->ranks.edp_size, kept, sums[E + SUM_DROPPED], r->stats.aux_loss, r->stats.z_loss,
           sums[E + SUM_CHECKSUM]);
    json_time("forward_ms", r, BENCH_LAYER_FORWARD);
    json_time("backward_ms", r, BENCH_LAYER_BACKWARD);
    json_time("total_ms", r, BENCH_LAYER_FWD_BWD);
    printf(",\"gflop\":{\"forward\":%.6f,\"backward\":%.6f,\"total\":%.6f},\"gflops\":%.3f", r->flop_forward * 1e-9,
           r->flop_backward * 1e-9, flop_total * 1e-9, flop_total / r->median_ms[BENCH_LAYER_FWD_BWD] * 1e-6);
    if (variant->distributed) {
        json_time("reduce_ms", r, BENCH_LAYER_REDUCE);
        json_time("step_ms", r, BENCH_LAYER_STEP);
        printf(",\"tokens_per_s\":%.1f,\"rows_received_min\":%d,\"rows_received_max\":%d,\"exchange_ms\":{",
               tokens_per_s, rows[0], rows[1]);
        for (int k = 0; k < MOE_EXCHANGE_KINDS; k++) printf("\"%s\":%.4f,", moe_exchange_kind_name(k), ex[k]);
        printf("\"all\":%.4f}", r->median_ms[BENCH_LAYER_EXCHANGE_ALL]);
    }
    if (variant->json) variant->json(r);
    printf("}\n");
}

/* ---- the program ---------------------------------------------------------------------------------------- */

int bench_moe_layer_main(const bench_layer_variant *v, int argc, char **argv) {
    variant = v;
    bench_layer_options o = v->defaults;
    o.world_size = 1;
    if (v->start) v->start(&argc, &argv, v->program, &o.world_size);
    else bench_set_name(v->program);
    parse(argc, argv, &o); /* --help, --dry-run and usage errors leave here, before any collective or GPU */
    if (o.threads == 0) o.threads = moe_threads_default();
    moe_threads_set(o.threads);

    bench_layer_run run = {.o = &o, .cfg = config_of(&o)};
    bench_layer_run *r = &run;
    v->open(r);
    r->ranks = moe_parallel_ranks(r->par);
    const int rank0 = r->ranks.world_rank == 0, N = o.iters;
    if (rank0) v->describe(r), print_shape(r), fflush(stdout);
    make_model_and_batch(r);
    bench_check(moe_layer_create(&r->cfg, r->rt, r->par, &r->layer), "moe_layer_create");

    double *series = malloc((size_t)BENCH_LAYER_SERIES * N * sizeof *series);
    if (!series) bench_fail("out of memory");
    time_layer(r, series);
    /* per rank: medians, minima and the rows received; then the maximum over ranks of each (rows also negated:
     * the maximum of -rows is minus the minimum) */
    double local[2 * BENCH_LAYER_SERIES + 2];
    for (int s = 0; s < BENCH_LAYER_SERIES; s++) {
        local[BENCH_LAYER_SERIES + s] = bench_min(series + (size_t)s * N, N);
        local[s] = bench_median(series + (size_t)s * N, N);
    }
    free(series);
    local[2 * BENCH_LAYER_SERIES] = r->stats.num_rows_received;
    local[2 * BENCH_LAYER_SERIES + 1] = -r->stats.num_rows_received;
    max_over_ranks(r, local, 2 * BENCH_LAYER_SERIES + 2);
    memcpy(r->median_ms, local, sizeof r->median_ms);
    memcpy(r->min_ms, local + BENCH_LAYER_SERIES, sizeof r->min_ms);
    const int rows[2] = {(int)-local[2 * BENCH_LAYER_SERIES + 1], (int)local[2 * BENCH_LAYER_SERIES]};

    double *sums = malloc(((size_t)o.experts + NUM_SUMS) * sizeof *sums);
    if (!sums) bench_fail("out of memory");
    sum_over_ranks(r, sums);
    for (int e = 0; e < o.experts; e++) r->rows_kept += sums[e];
    r->flop_experts_forward = 3.0 * 2.0 * r->rows_kept * o.d_model * o.d_ff;
    r->flop_router_forward = 2.0 * o.tokens * o.d_model * o.experts;
    r->flop_forward = r->flop_experts_forward + r->flop_router_forward;
    r->flop_backward = 2 * r->flop_forward;
    if (rank0) report(r, sums, rows);
    free(sums);

    moe_layer_destroy(r->layer);
    moe_real *buffers[] = {r->weights, r->grads, r->x, r->dout, r->out, r->dx};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) moe_runtime_free(r->rt, buffers[i]);
    moe_parallel_destroy(r->par);
    moe_runtime_destroy(r->rt);
    fflush(stdout);
    if (v->finish) v->finish();
    return 0;
}
