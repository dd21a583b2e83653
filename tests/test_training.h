/* test_training.h — what the training tests share: a synthetic corpus a model can learn (a noisy Markov
 * chain over 32 tokens), the options of a tiny model with 8 experts and capacity drops, and a trainer on
 * MPI to drive. */
#ifndef MOE_TESTS_TEST_TRAINING_H
#define MOE_TESTS_TEST_TRAINING_H

#include "alltoall/parallel.h"
#include "train/trainer.h"

enum { TEST_VOCAB = 32 };

/* A temporary directory holding train.bin and val.bin (a tenth of the size) of that corpus; tests may put
 * more files in it. */
typedef struct {
    char dir[64], train[128], val[128];
} test_corpus;

/* Rank 0 creates the directory and the files; every rank gets the paths. Collective; aborts on failure. */
void test_corpus_create(test_corpus *c, long train_tokens);
/* Rank 0 removes the directory and everything in it. Collective. */
void test_corpus_remove(const test_corpus *c);

/* V = 32, 2 layers, d = 32, 4 heads / 2 kv heads, d_ff 32, S = 16, E = 8, k = 2, capacity 1.25,
 * 8 sequences per micro-batch. */
moe_train_options test_small_options(const char *train, const char *val, int ep, int steps, int micro_batches);

/* A trainer on its own MPI layout with expert-parallel size ep, for the tests that drive moe_trainer. */
typedef struct {
    moe_parallel *par;
    moe_trainer t;
} test_run;

/* Collective; aborts the job on failure. */
void test_run_start(test_run *r, int ep, moe_train_options o);
void test_run_stop(test_run *r);
/* Steps first..last; losses[i - 1] gets step i's loss (losses NULL: not kept). */
void test_run_steps(test_run *r, int first, int last, double *losses);

#endif
