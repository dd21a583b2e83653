/* bench_moe_layer_ep.c — the cpu-ep variant of the MoE layer benchmark (bench_moe_layer_driver.h): one
 * training step of the CPU layer under expert parallelism, on one machine.
 *
 * Under mpirun -np W with --ep EP (dp = W/EP): the global batch of --tokens-global tokens is split over the
 * W ranks in rank order (the first T % W ranks get one token more), each rank holds E/EP experts
 * (moe_parallel_create_mpi). Every layout computes the same model on the same batch (the driver's
 * generator; with --layout-invariant 1 the printed checksum is the same for every W and EP up to the order
 * of its final sum). One step = moe_layer_forward + moe_layer_backward + moe_layer_reduce_gradients
 * (gradients zeroed before it and an MPI barrier, both untimed). Reported: the max over ranks of each rank's
 * median step time and of its parts, tokens/s = global tokens / that time, and the time spent inside the
 * exchanges of the three communicators (world, ep, expert-dp) by kind (alltoall/comm_timing.h):
 * dispatch+combine payload (alltoallv), counts (alltoall), routing (scans and gathers), allreduce (losses,
 * gradients), barrier. Exchange times include waiting for slower peers (load imbalance) and, with more ranks
 * than cores, time descheduled. Last line: "json: {...}".
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
#include <stdlib.h>

#include "alltoall/parallel_mpi.h"
#include "bench/bench_moe_layer_driver.h"
#include "bench/bench_moe_layer_mpi.h"

static const bench_flag kFlags[] = {
    BENCH_LAYER_MPI_FLAGS,
};

static void open_cpu_ep(bench_layer_run *r) {
    bench_check(moe_runtime_create_cpu(&r->rt), "moe_runtime_create_cpu");
    bench_check(moe_parallel_create_mpi(MPI_COMM_WORLD, r->o->ep, r->o->timeout_s, &r->par), "moe_parallel_create_mpi");
}

static void describe_openblas(const bench_layer_run *r) {
    const char *env = getenv("OPENBLAS_NUM_THREADS"); /* mpirun's binding to a core can cap threads at 1 */
    const moe_ranks k = r->ranks;
    printf("openblas: threads=%d per rank (OPENBLAS_NUM_THREADS=%s) corename=%s  W=%d ep=%d dp=%d  experts/rank %d\n",
           openblas_get_num_threads(), env ? env : "(unset)", openblas_get_corename(), k.world_size, k.ep_size,
           k.edp_size, r->o->experts / k.ep_size);
}

static void json_openblas(const bench_layer_run *r) {
    (void)r;
    printf(",\"openblas_threads\":%d", openblas_get_num_threads());
}

static const bench_layer_variant kCpuEp = {
    .program = "bench_moe_layer_ep",
    .bench = "moe_layer_ep",
    .synopsis = "mpirun -np W bench_moe_layer_ep [flags]",
    .about = "one training step (forward, backward, gradient all-reduce) of the CPU MoE layer under expert\n"
             "parallelism, and the time inside its exchanges",
    .notes = "--ep must divide W and --experts",
    .tokens_flag = "--tokens-global",
    .distributed = 1,
    .defaults = {.tokens = 4096, .d_model = 512, .d_ff = 1024, .experts = 8, .top_k = 2, .layout_invariant = 1,
                 .warmup = 1, .iters = 5, .seed = 1234, .capacity_factor = 0, .ep = 1, .timeout_s = 300},
    .flags = kFlags,
    .num_flags = sizeof kFlags / sizeof kFlags[0],
    .start = bench_layer_mpi_start,
    .check = bench_layer_mpi_check,
    .open = open_cpu_ep,
    .describe = describe_openblas,
    .json = json_openblas,
    .finish = bench_layer_mpi_finish,
};

int main(int argc, char **argv) { return bench_moe_layer_main(&kCpuEp, argc, argv); }
