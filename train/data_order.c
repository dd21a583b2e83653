/* data_order.c — the order windows are read in (data_order.h: the Feistel permutation and why it is one). */
#include "train/data_order.h"

enum { FEISTEL_ROUNDS = 6 }; /* 4 make a pseudo-random permutation (Luby-Rackoff); 2 more for margin */

uint64_t moe_data_mix64(uint64_t x) {
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27, x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int64_t moe_data_permute(uint64_t seed, int64_t epoch, int64_t num_windows, int64_t j) {
    int h = 0; /* half width: 4^h >= num_windows */
    while (h < 31 && ((int64_t)1 << (2 * h)) < num_windows) h++;
    const uint64_t mask = ((uint64_t)1 << h) - 1;
    uint64_t keys[FEISTEL_ROUNDS];
    const uint64_t base = moe_data_mix64(moe_data_mix64(seed + 0x9e3779b97f4a7c15ull) ^ (uint64_t)epoch);
    for (int r = 0; r < FEISTEL_ROUNDS; r++) keys[r] = moe_data_mix64(base + (uint64_t)(r + 1) * 0x9e3779b97f4a7c15ull);
    uint64_t x = (uint64_t)j;
    do { /* cycle-walking: stays inside [0, num_windows) */
        uint64_t left = x >> h, right = x & mask;
        for (int r = 0; r < FEISTEL_ROUNDS; r++) {
            const uint64_t next = left ^ (moe_data_mix64(keys[r] ^ right) & mask);
            left = right, right = next;
        }
        x = left << h | right;
    } while (x >= (uint64_t)num_windows);
    return (int64_t)x;
}

int64_t moe_data_window(int shuffle, uint64_t seed, int64_t num_windows, int64_t n) {
    const int64_t epoch = n / num_windows, j = n % num_windows;
    return shuffle ? moe_data_permute(seed, epoch, num_windows, j) : j;
}
