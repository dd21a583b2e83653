/* gpu_counters.c — the host-wait and allocation counters of a GPU context as data (core/gpu.h): finding a reason's
 * slot and the text of a step's counts. Plain C in libmoe, so that moe-train formats them without linking CUDA. */
#include <stdio.h>
#include <string.h>

#include "core/gpu.h"

int moe_gpu_counters_slot(moe_gpu_counters *c, const char *reason) {
    for (int i = 0; i < c->reasons; i++)
        if (c->reason[i] == reason || !strcmp(c->reason[i], reason)) return i;
    if (c->reasons < MOE_GPU_WAIT_REASONS) {
        c->reason[c->reasons] = reason;
        return c->reasons++;
    }
    c->reason[MOE_GPU_WAIT_REASONS - 1] = "other";
    return MOE_GPU_WAIT_REASONS - 1;
}

void moe_gpu_counters_delta_text(const moe_gpu_counters *now, const moe_gpu_counters *before, char *out, size_t n) {
    unsigned long long delta[MOE_GPU_WAIT_REASONS] = {0}, total = 0;
    int order[MOE_GPU_WAIT_REASONS];
    for (int i = 0; i < now->reasons; i++) { /* a slot's reason is the same in both: slots are only ever added */
        delta[i] = now->waits[i] - (i < before->reasons ? before->waits[i] : 0);
        total += delta[i], order[i] = i;
    }
    for (int i = 1; i < now->reasons; i++) /* by decreasing count, then slot: a stable insertion sort */
        for (int j = i; j > 0 && delta[order[j]] > delta[order[j - 1]]; j--) {
            const int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    size_t used = 0;
    int w = snprintf(out, n, "%llu host waits", total);
    used = w > 0 ? (size_t)w : 0;
    const char *sep = " (";
    for (int k = 0; k < now->reasons && used < n; k++) {
        if (!delta[order[k]]) continue;
        w = snprintf(out + used, n - used, "%s%s %llu", sep, now->reason[order[k]], delta[order[k]]);
        used += w > 0 ? (size_t)w : 0, sep = ", ";
    }
    if (used < n && total) used += (size_t)snprintf(out + used, n - used, ")");
    if (used < n)
        snprintf(out + used, n - used, "; %llu device allocations", now->allocations - before->allocations);
}
