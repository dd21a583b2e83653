/* fnv1a.h — FNV-1a, 64 bits: a fast hash of bytes for identities and comparisons (not for security): the data set's
 * identity (train/dataloader.c) and the ranks' options compared at start (train/rank_agreement.c). */
#ifndef MOE_CORE_FNV1A_H
#define MOE_CORE_FNV1A_H

#include <stddef.h>
#include <stdint.h>

#define MOE_FNV1A_SEED 0xcbf29ce484222325ull

/* FNV-1a over n bytes, continuing from h (MOE_FNV1A_SEED to start) */
static inline uint64_t moe_fnv1a(uint64_t h, const void *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)bytes)[i]) * 0x100000001b3ull;
    return h;
}

#endif
