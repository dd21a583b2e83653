/* bench_moe_layer_driver.h — one benchmark of the MoE layer (forward + backward [+ gradient all-reduce]) and
 * the table that each of its variants fills in: nccl-tests' pattern of one common driver and a small table
 * per collective, with "where it runs and who talks to whom" in place of the collective.
 *
 *   variant  program                  runtime                     layout
 *   cpu      bench_moe_layer          moe_runtime_create_cpu      moe_parallel_create_self
 *   cpu-ep   bench_moe_layer_ep       moe_runtime_create_cpu      moe_parallel_create_mpi (under mpirun)
 *   gpu      bench_moe_layer_gpu      moe_runtime_create_cuda(0)  moe_parallel_create_self_gpu
 *   gpu-ep   bench_moe_layer_gpu_ep   moe_runtime_create_cuda(node rank % devices)
 *                                                                 moe_parallel_create_mpi_gpu (nccl | mpi)
 *
 * The driver (bench_moe_layer_driver.c) holds what they share: the common flags and their checks, the model
 * and batch from --seed (the same for every variant and layout), the buffers in the runtime's memory, the
 * timing loop, the common report lines and the final "json: {...}" line. A variant's table holds what
 * differs: how the program starts and ends (MPI or not), its own flags and defaults, the runtime and layout,
 * its header lines and any extra report (the CPU's sgemm floor, the device's name).
 */
#ifndef BENCH_MOE_LAYER_DRIVER_H
#define BENCH_MOE_LAYER_DRIVER_H

#include "alltoall/comm_timing.h"
#include "bench/bench_util.h"

/* Every flag of every variant (a variant's table names the ones it takes); the driver's common flags first. */
typedef struct {
    int tokens;           /* the global batch; under mpirun split over the ranks in rank order */
    int d_model, d_ff, experts, top_k, layout_invariant, warmup, iters, seed;
    int precision;        /* moe_precision (core/precision.h) */
    int shards;           /* moe_config.num_shards: 0 off, else the batch's virtual shards (world-invariant sums) */
    int threads;          /* CPU threads per rank (core/threads.h); 0: moe_threads_default() */
    double capacity_factor;
    int ep;               /* expert-parallel size (1 where the variant has no --ep) */
    int transport;        /* gpu-ep: moe_gpu_transport (alltoall/parallel_gpu_mpi.h) */
    double timeout_s;     /* MPI variants: the watchdog of every exchange */
    int world_size;       /* not a flag: W, known before parsing (the checks need it) */
} bench_layer_options;

/* The timed series, each reduced to a median and a minimum per rank, then to the maximum over ranks. */
enum {
    BENCH_LAYER_FORWARD,
    BENCH_LAYER_BACKWARD,
    BENCH_LAYER_FWD_BWD,
    BENCH_LAYER_REDUCE,   /* the gradient all-reduce (distributed variants) */
    BENCH_LAYER_STEP,     /* forward + backward + reduce */
    BENCH_LAYER_EXCHANGE, /* per kind of exchange (alltoall/comm_timing.h), MOE_EXCHANGE_KINDS of them */
    BENCH_LAYER_EXCHANGE_ALL = BENCH_LAYER_EXCHANGE + MOE_EXCHANGE_KINDS,
    BENCH_LAYER_SERIES
};

/* One run: what the driver made, for the variant's hooks. Buffers are the runtime's memory (host memory on
 * the CPU runtime), sized for this rank. */
typedef struct {
    const bench_layer_options *o;
    moe_config cfg;              /* the layer's config (the layout's ep is o->ep)       */
    moe_runtime *rt;             /* set by the variant's open; the driver destroys it */
    moe_parallel *par;           /* set by the variant's open; the driver destroys it */
    moe_ranks ranks;
    int first_token, num_tokens; /* this rank's slice [first, first + num) of the global batch */
    moe_layer *layer;
    moe_real *weights, *grads;   /* moe_layer_num_params(cfg, o->ep) reals each; w and g are their views */
    moe_layer_weights w, g;
    moe_real *x, *dout, *out, *dx; /* [num_tokens, d_model] */
    moe_layer_stats stats;       /* of the last forward */
    /* after the timing, on rank 0: ms, the maximum over ranks of each rank's median / minimum */
    double median_ms[BENCH_LAYER_SERIES], min_ms[BENCH_LAYER_SERIES];
    double rows_kept;            /* kept assignments over the world: the rows through the experts */
    /* GEMM FLOPs of one iteration summed over the ranks: experts 3 GEMMs of 2 * rows_kept * d * d_ff
     * forward, the router 2 * T * d * E; backward twice the forward */
    double flop_experts_forward, flop_router_forward, flop_forward, flop_backward;
} bench_layer_run;

typedef struct {
    const char *program;     /* "bench_moe_layer": messages and --help */
    const char *bench;       /* the "bench" member of the JSON line */
    const char *synopsis;    /* how it is run, after "usage: " */
    const char *about;       /* what it measures (--help) */
    const char *notes;       /* after the flag list in --help, or NULL */
    const char *tokens_flag; /* "--tokens", or "--tokens-global" where the batch is split over ranks */
    int distributed;         /* under mpirun: barrier before each step, gradient all-reduce in it, exchange
                              * times, the step line */
    bench_layer_options defaults;
    const bench_flag *flags; /* the variant's own flags (targets in bench_layer_options), after the common ones */
    int num_flags;
    /* Before parsing: start the program (MPI_Init) and fill *world_size; NULL: one process. */
    void (*start)(int *argc, char ***argv, const char *program, int *world_size);
    /* The variant's checks across flags (bench_usage_error*), after the driver's; or NULL. */
    void (*check)(const bench_layer_options *o);
    /* After parsing: run->rt and run->par (leave with 77 where there is no GPU, on every rank alike). */
    void (*open)(bench_layer_run *run);
    /* Rank 0, before the common lines: who and where (BLAS, GPU, layout). */
    void (*describe)(const bench_layer_run *run);
    /* Rank 0, after the common lines: more lines (may time more work of its own, no collectives); or NULL. */
    void (*report)(bench_layer_run *run);
    /* Rank 0: more JSON members, each as ,"name":value; or NULL. */
    void (*json)(const bench_layer_run *run);
    /* The last thing before exit 0 (MPI_Finalize), or NULL. */
    void (*finish)(void);
} bench_layer_variant;

/* The whole program: parse, open, generate, time, report; returns main's exit code. */
int bench_moe_layer_main(const bench_layer_variant *variant, int argc, char **argv);

#endif
