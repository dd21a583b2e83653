/* rng.c — splitmix64 and uniform fills. */
#include "core/rng.h"

moe_rng moe_rng_seeded(uint64_t seed) { return (moe_rng){seed * 0x9E3779B97F4A7C15ull + 1}; }

uint64_t moe_rng_next(moe_rng *rng) {
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double moe_rng_uniform(moe_rng *rng) { return (double)(moe_rng_next(rng) >> 11) * 0x1.0p-52 - 1.0; }

void moe_rng_fill_uniform(moe_rng *rng, moe_real *a, size_t count, double scale) {
    for (size_t i = 0; i < count; i++) a[i] = (moe_real)(scale * moe_rng_uniform(rng));
}
