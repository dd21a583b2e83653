/* test_training.h — what the training tests share: a synthetic corpus a model can learn (a noisy Markov
 * chain over 32 tokens) and the options of a tiny model with 8 experts and capacity drops. */
#ifndef MOE_TESTS_TEST_TRAINING_H
#define MOE_TESTS_TEST_TRAINING_H

#include "models/train_options.h"

enum { TEST_VOCAB = 32 };

/* Writes an llm.c token file of n tokens (aborts the job on failure). */
void test_write_corpus(const char *path, long n, unsigned long long seed);

/* V = 32, 2 layers, d = 32, 4 heads / 2 kv heads, d_ff 32, S = 16, E = 8, k = 2, capacity 1.25,
 * 8 sequences per micro-batch. */
train_options test_small_options(const char *train, const char *val, int ep, int steps, int micro_batches);

#endif
