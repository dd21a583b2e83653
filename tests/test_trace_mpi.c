/* test_trace_mpi.c — routing traces (train/routing_trace.h) under mpirun -np 2, on a tiny model with
 * capacity drops:
 *  - a run that replays its own trace (here on another ep) reproduces the recorded run's losses bitwise;
 *  - replay really drives the routing: a trace that sends every token to experts 0 and 1 gives other
 *    losses and only those two experts receive tokens;
 *  - a corrupt trace (a flipped byte, a truncated file, a header from another configuration) is refused
 *    with a clear error on every rank, without a hang. */
#include <stdlib.h>
#include <string.h>

#include "alltoall/parallel_mpi.h"
#include "core/fail.h"
#include "train/trainer.h"
#include "tests/test_mpi.h"
#include "tests/test_training.h"

enum { STEPS = 6, E = 8 };

static test_corpus corpus; /* the traces go into its directory too */
static const char *dir;
static char recorded[128];
static int rank;

/* Runs STEPS steps; returns the status of the first failure (creation or step) or MOE_OK. */
static moe_status run(moe_train_options o, int ep, double *losses, double *expert_tokens) {
    moe_parallel *par;
    moe_trainer t;
    test_mpi_require(moe_parallel_create_mpi(MPI_COMM_WORLD, ep, 60, &par), "parallel layout");
    o.ep = ep;
    moe_status st = moe_trainer_create(&t, &o, NULL, par);
    moe_step_result r = {0};
    r.expert_tokens = calloc((size_t)o.model.num_layers * E, sizeof(double));
    for (int s = 1; s <= STEPS && st == MOE_OK; s++) {
        st = moe_trainer_step(&t, s, &r);
        if (losses) losses[s - 1] = r.loss;
        for (int i = 0; expert_tokens && st == MOE_OK && i < o.model.num_layers * E; i++)
            expert_tokens[i] += r.expert_tokens[i];
    }
    free(r.expert_tokens);
    moe_trainer_destroy(&t); /* also after a failed moe_trainer_create, which leaves it empty */
    moe_parallel_destroy(par);
    return st;
}

/* Rank 0 writes a trace in which every token of every record picks experts 0 and 1. */
static void write_fixed_trace(const char *path, const moe_train_options *o) {
    const int tokens = o->batch * o->model.seq_len, k = o->model.moe.top_k;
    int *ids = malloc((size_t)tokens * k * sizeof(int));
    for (int i = 0; i < tokens * k; i++) ids[i] = i % k;
    moe_routing_trace t;
    test_mpi_require(moe_routing_trace_create(&t, path, E, k, o->model.num_layers, tokens, o->micro_batches),
                     "trace create");
    for (int s = 1; s <= STEPS; s++)
        for (int l = 0; l < o->model.num_layers; l++)
            test_mpi_require(moe_routing_trace_write(&t, s, 0, l, ids), "trace write");
    moe_routing_trace_close(&t);
    free(ids);
}

static void rewrite(const char *from, const char *to, long flip_at, long keep_nbytes) {
    FILE *f = fopen(from, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    unsigned char *data = malloc((size_t)n);
    if (fread(data, 1, (size_t)n, f) != (size_t)n) test_mpi_require(MOE_ERR_IO, "read trace");
    fclose(f);
    if (flip_at >= 0) data[flip_at] ^= 0x01;
    f = fopen(to, "wb");
    fwrite(data, 1, (size_t)(keep_nbytes >= 0 ? keep_nbytes : n), f);
    fclose(f);
    free(data);
}

/* The run must fail with a message that starts with `label` and contains `why`. */
static void expect_refused(const char *what, moe_train_options o, const char *label, const char *why) {
    moe_status st = run(o, 1, NULL, NULL);
    CHECK(st != MOE_OK, "%s: accepted", what);
    const char *message = moe_failure_message(st);
    if (rank == 0) {
        CHECK(!strncmp(message, label, strlen(label)) && strstr(message, why), "%s: '%s' is not '%s...%s'", what,
              message, label, why);
        printf("%-20s refused: %s\n", what, message);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    test_corpus_create(&corpus, 50000);
    dir = corpus.dir;
    snprintf(recorded, sizeof recorded, "%s/recorded.trace", dir);

    double original[STEPS], replayed[STEPS], forced[STEPS], tokens[2 * E] = {0};
    moe_train_options o = test_small_options(corpus.train, corpus.val, 1, STEPS, 1);
    moe_train_options rec = o;
    rec.routing_trace_out = recorded;
    test_mpi_require(run(rec, 1, original, NULL), "recording run");

    moe_train_options replay = o;
    replay.routing_trace_in = recorded;
    test_mpi_require(run(replay, 2, replayed, NULL), "replay run");
    CHECK(!memcmp(original, replayed, sizeof original), "the replayed run's losses differ from the recorded run's");
    if (rank == 0) printf("replay on ep 2 of a trace recorded on ep 1: %d steps' losses bitwise equal\n", STEPS);

    char fixed[128];
    snprintf(fixed, sizeof fixed, "%s/fixed.trace", dir);
    if (rank == 0) write_fixed_trace(fixed, &o);
    MPI_Barrier(MPI_COMM_WORLD);
    replay.routing_trace_in = fixed;
    test_mpi_require(run(replay, 1, forced, tokens), "fixed-trace run");
    CHECK(memcmp(original, forced, sizeof original) != 0, "a different trace gave the same losses");
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < E; e++)
            CHECK((tokens[l * E + e] > 0) == (e < 2), "layer %d expert %d received %g tokens", l, e, tokens[l * E + e]);

    char bad[128];
    snprintf(bad, sizeof bad, "%s/bad.trace", dir);
    replay.routing_trace_in = bad;
    /* Each rewrite waits for every rank to be done with the file: a rank still in the previous run could
     * otherwise open the new bytes while its peers read the old ones, fail elsewhere than they do, and leave
     * them waiting in a collective until the watchdog (seen once: 60 s, then Open MPI crashed on the stray
     * watchdog question at the next MPI_Comm_dup). */
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) rewrite(recorded, bad, 32 + 16 + 5, -1); /* a byte of the first record's ids */
    MPI_Barrier(MPI_COMM_WORLD);
    expect_refused("flipped byte", replay, "routing replay: ", "record of step 1, layer 0 is corrupt");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) rewrite(recorded, bad, -1, 600); /* the header and part of the first record */
    MPI_Barrier(MPI_COMM_WORLD);
    expect_refused("truncated", replay, "routing replay: ", "(truncated?)");
    moe_train_options four = replay;
    four.model.moe = moe_config_default(o.model.d_model, o.model.d_ff, 4, 2);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) rewrite(recorded, bad, -1, -1);
    MPI_Barrier(MPI_COMM_WORLD);
    expect_refused("another config", four, "bad routing trace: ", "experts is 8 in the trace but 4 in this run");

    test_corpus_remove(&corpus);
    return test_mpi_finish("test_trace_mpi");
}
