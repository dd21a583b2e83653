/* test_training.c — the shared corpus and tiny-model options of the training tests. */
#include "tests/test_training.h"

#include <stdio.h>
#include <stdlib.h>

#include "alltoall/parallel_mpi.h"
#include "train/dataloader.h"
#include "tests/test_mpi.h"

static void write_corpus(const char *path, long n, unsigned long long seed) {
    unsigned short *tokens = malloc((size_t)n * sizeof *tokens);
    moe_rng rng = moe_rng_seeded(seed);
    tokens[0] = 0;
    for (long i = 1; i < n; i++)
        tokens[i] = (unsigned short)((3 * tokens[i - 1] + 1 + moe_rng_next(&rng) % 2) % TEST_VOCAB);
    test_mpi_require(moe_token_file_write(path, tokens, n), "writing the corpus");
    free(tokens);
}

void test_corpus_create(test_corpus *c, long train_tokens) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(c->dir, sizeof c->dir, "/tmp/moe-test-XXXXXX");
    if (rank == 0 && !mkdtemp(c->dir)) test_mpi_require(MOE_ERR_IO, "mkdtemp");
    MPI_Bcast(c->dir, sizeof c->dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(c->train, sizeof c->train, "%s/train.bin", c->dir);
    snprintf(c->val, sizeof c->val, "%s/val.bin", c->dir);
    if (rank == 0) write_corpus(c->train, train_tokens, 1), write_corpus(c->val, train_tokens / 10, 2);
    MPI_Barrier(MPI_COMM_WORLD);
}

void test_corpus_remove(const test_corpus *c) {
    int rank;
    char cmd[128];
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
    if (rank == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", c->dir);
}

moe_train_options test_small_options(const char *train, const char *val, int ep, int steps, int micro_batches) {
    moe_train_options o;
    char *argv[] = {"test", NULL};
    moe_train_options_parse(1, argv, 1, &o, NULL);
    moe_model_config *m = &o.model;
    m->vocab_size = TEST_VOCAB, m->num_layers = 2, m->d_model = 32, m->num_heads = 4, m->num_kv_heads = 2;
    m->d_ff = 32, m->seq_len = 16;
    m->moe = moe_config_default(m->d_model, m->d_ff, 8, 2);
    m->moe.capacity_factor = 1.25f;
    o.ep = ep, o.batch = 8, o.micro_batches = micro_batches, o.steps = steps, o.warmup = 1;
    o.lr = 3e-3f, o.min_lr = 3e-4f;
    o.eval_batches = 2, o.train_data = train, o.val_data = val;
    return o;
}

void test_run_start(test_run *r, int ep, moe_train_options o) {
    test_mpi_require(moe_parallel_create_mpi(MPI_COMM_WORLD, ep, 60, &r->par), "parallel layout");
    o.ep = ep;
    test_mpi_require(moe_trainer_create(&r->t, &o, NULL, r->par), "trainer");
}

void test_run_stop(test_run *r) {
    moe_trainer_destroy(&r->t);
    moe_parallel_destroy(r->par);
}

void test_run_steps(test_run *r, int first, int last, double *losses) {
    const moe_model_config *m = &r->t.opt.model;
    moe_step_result s = {0};
    s.expert_tokens = calloc((size_t)m->num_layers * m->moe.num_experts, sizeof(double));
    for (int i = first; i <= last; i++) {
        test_mpi_require(moe_trainer_step(&r->t, i, &s), "step");
        if (losses) losses[i - 1] = s.loss;
    }
    free(s.expert_tokens);
}
