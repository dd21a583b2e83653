/* data_order.h — which window of the data set global sequence number n is: in order (wrapping), or a seeded
 * permutation of all windows, a new one each epoch, computed and never stored.
 *
 * With M windows, sequence n is in epoch e = n / M at position j = n % M. In order, it is window j. Shuffled, it
 * is window perm_{seed,e}(j), where perm is a keyed Feistel network on [0, 4^h) (4^h >= M the smallest) restricted
 * to [0, M) by cycle-walking:
 *   - one round maps (L, R), two h-bit halves, to (R, L xor F_k(R)); it is a bijection whatever F is, since
 *     (R, L') gives back L = L' xor F_k(R). A composition of bijections is one: the network permutes [0, 4^h).
 *   - cycle-walking applies the network P again until the value falls in [0, M): from x in [0, M) the walk follows
 *     x's cycle of P, which comes back to x, so it ends. It is one-to-one: if the walks from x and x' end at the same
 *     y, step back from y with P's inverse; every value between a start and y lies outside [0, M), so the first
 *     value of [0, M) met stepping back is both x and x'. One-to-one on a finite set: a bijection of [0, M), every
 *     window once per epoch. Since 4^h < 4M, a walk takes fewer than 4 evaluations of P on average.
 * Round keys come from (seed, epoch) through splitmix64 (a bijective 64-bit mixer); F_k(R) = splitmix64(k ^ R)'s
 * low h bits. Everything depends on (seed, epoch, M, j) only, so every rank and every layout agrees on the
 * global batch. Costs O(rounds * walk) per sequence, O(1) memory. */
#ifndef MOE_TRAIN_DATA_ORDER_H
#define MOE_TRAIN_DATA_ORDER_H

#include <stdint.h>

/* splitmix64's output function of x (its state step added by the callers that need one). */
uint64_t moe_data_mix64(uint64_t x);

/* perm_{seed,epoch}(j) for j in [0, num_windows); num_windows >= 1. */
int64_t moe_data_permute(uint64_t seed, int64_t epoch, int64_t num_windows, int64_t j);

/* The window of global sequence n (>= 0) of a data set of num_windows >= 1 windows: n % num_windows unshuffled,
 * else moe_data_permute(seed, n / num_windows, num_windows, n % num_windows). */
int64_t moe_data_window(int shuffle, uint64_t seed, int64_t num_windows, int64_t n);

#endif
