/* rng.h — a small seeded generator (splitmix64) for weight init, demos and tests: every random value
 * derives from a seed, so any run reproduces. Not for cryptography. */
#ifndef MOE_CORE_RNG_H
#define MOE_CORE_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "core/types.h"

typedef struct {
    uint64_t state;
} moe_rng;

moe_rng moe_rng_seeded(uint64_t seed);
uint64_t moe_rng_next(moe_rng *rng);
double moe_rng_uniform(moe_rng *rng); /* [-1, 1) with 52 random bits */
void moe_rng_fill_uniform(moe_rng *rng, moe_real *a, size_t count, double scale); /* scale * [-1, 1) */

#endif
