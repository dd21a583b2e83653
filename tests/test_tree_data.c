/* test_tree_data.c — test data and oracle of the fixed tree (test_tree_data.h). */
#include "tests/test_tree_data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"

static uint64_t mix(uint64_t x) { /* splitmix64's finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static double leaf_value(uint64_t seed, int leaf, size_t i) {
    const uint64_t h = mix(seed ^ mix((uint64_t)leaf * 0x100000001B3ull ^ mix(i)));
    const uint64_t g = mix(h);
    const double u = (double)(h >> 11) * 0x1.0p-53; /* [0, 1) */
    const int e = (int)((g >> 1) % 49) - 24;
    return (g & 1 ? -1.0 : 1.0) * ldexp(1 + u, e);
}

size_t test_tree_elem_nbytes(moe_tree_dtype dtype) { return dtype == MOE_TREE_F64 ? sizeof(double) : sizeof(float); }

/* Every leaf's values, [leaf][i], for the last (seed, count) asked: the oracles read each value many times (every
 * element's tree over all S leaves, the chains of subtrees, this rank's node, the local pushes), and hashing them
 * anew each time was most of test_tree_allreduce_mpi's CPU (on every rank of its 1 to 8). A float leaf is the
 * double's value rounded, as before. */
static struct {
    uint64_t seed;
    size_t count;
    double *values;
} cached;

static const double *leaf_values(uint64_t seed, size_t count) {
    if (cached.values && cached.seed == seed && cached.count == count) return cached.values;
    free(cached.values);
    cached.values = malloc((count ? count : 1) * TEST_TREE_LEAVES * sizeof(double));
    if (!cached.values) {
        fprintf(stderr, "test_tree_data: no memory for %d leaves of %zu values\n", TEST_TREE_LEAVES, count);
        abort();
    }
    cached.seed = seed, cached.count = count;
    for (int leaf = 0; leaf < TEST_TREE_LEAVES; leaf++)
        for (size_t i = 0; i < count; i++) cached.values[leaf * count + i] = leaf_value(seed, leaf, i);
    return cached.values;
}

void test_tree_fill_leaf(moe_tree_dtype dtype, uint64_t seed, int leaf, size_t count, void *out) {
    const double *v = leaf_values(seed, count) + leaf * count;
    for (size_t i = 0; i < count; i++)
        if (dtype == MOE_TREE_F64) ((double *)out)[i] = v[i];
        else ((float *)out)[i] = (float)v[i];
}

/* element i of the sum over leaves [lo, hi), the values being v[leaf * count + i] */
static float tree_f32(const double *v, size_t count, int lo, int hi, size_t i) {
    if (hi - lo == 1) return (float)v[lo * count + i];
    const int mid = lo + (hi - lo) / 2;
    return tree_f32(v, count, lo, mid, i) + tree_f32(v, count, mid, hi, i);
}

static double tree_f64(const double *v, size_t count, int lo, int hi, size_t i) {
    if (hi - lo == 1) return v[lo * count + i];
    const int mid = lo + (hi - lo) / 2;
    return tree_f64(v, count, lo, mid, i) + tree_f64(v, count, mid, hi, i);
}

void test_tree_oracle(moe_tree_dtype dtype, uint64_t seed, int lo, int hi, size_t count, void *out) {
    const double *v = leaf_values(seed, count);
    for (size_t i = 0; i < count; i++)
        if (dtype == MOE_TREE_F64) ((double *)out)[i] = tree_f64(v, count, lo, hi, i);
        else ((float *)out)[i] = tree_f32(v, count, lo, hi, i);
}

void test_tree_chain_of_subtrees(moe_tree_dtype dtype, uint64_t seed, int span, size_t count, void *out) {
    const double *v = leaf_values(seed, count);
    for (size_t i = 0; i < count; i++) {
        if (dtype == MOE_TREE_F64) {
            double sum = tree_f64(v, count, 0, span, i);
            for (int lo = span; lo < TEST_TREE_LEAVES; lo += span) sum += tree_f64(v, count, lo, lo + span, i);
            ((double *)out)[i] = sum;
        } else {
            float sum = tree_f32(v, count, 0, span, i);
            for (int lo = span; lo < TEST_TREE_LEAVES; lo += span) sum += tree_f32(v, count, lo, lo + span, i);
            ((float *)out)[i] = sum;
        }
    }
}

static void require(moe_status st, const char *what) {
    if (st == MOE_OK) return;
    fprintf(stderr, "%s failed: %s\n", what, moe_failure_message(st));
    abort();
}

void test_tree_local(moe_tree_dtype dtype, uint64_t seed, int first, int n, size_t count, void *out) {
    moe_tree_acc acc;
    void *leaf = malloc(count ? count * test_tree_elem_nbytes(dtype) : 1);
    if (!leaf) require(MOE_ERR_OUT_OF_MEMORY, "leaf buffer");
    require(moe_tree_acc_init(&acc, dtype, n, count), "moe_tree_acc_init");
    for (int l = first; l < first + n; l++) {
        test_tree_fill_leaf(dtype, seed, l, count, leaf);
        require(moe_tree_acc_push(&acc, leaf), "moe_tree_acc_push");
    }
    const void *sum = moe_tree_acc_sum(&acc);
    if (!sum) require(MOE_ERR_INVALID_ARG, "moe_tree_acc_sum after every leaf");
    if (count) memcpy(out, sum, count * test_tree_elem_nbytes(dtype));
    moe_tree_acc_free(&acc);
    free(leaf);
}

size_t test_tree_count_diff(moe_tree_dtype dtype, const void *a, const void *b, size_t count, size_t *first_bad) {
    const size_t nbytes = test_tree_elem_nbytes(dtype);
    size_t bad = 0;
    *first_bad = 0;
    for (size_t i = 0; i < count; i++)
        if (memcmp((const char *)a + i * nbytes, (const char *)b + i * nbytes, nbytes) && bad++ == 0) *first_bad = i;
    return bad;
}
