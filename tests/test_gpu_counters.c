/* test_gpu_counters.c — the GPU context's host-wait and allocation counters as data (core/gpu_counters.c), which
 * moe-train prints for a step on a GPU (issue 50, item 4), checked without a GPU: a reason keeps its slot (found by
 * its text too), reasons past the table's size share its last slot as "other", and a step's line counts from one
 * snapshot to the next with the reasons in decreasing count (ties in the order first met).
 * Run: meson test -C build test_gpu_counters */
#include <string.h>

#include "core/gpu.h"
#include "tests/test_util.h"

static void wait(moe_gpu_counters *c, const char *reason, int times) {
    for (int i = 0; i < times; i++) c->waits[moe_gpu_counters_slot(c, reason)]++;
}

int main(void) {
    moe_gpu_counters c = {0};
    wait(&c, "download", 3);
    wait(&c, "sum of squares", 1);
    char copy[] = "download"; /* the same reason from another string */
    CHECK(moe_gpu_counters_slot(&c, copy) == 0 && c.reasons == 2, "a reason's slot is found by its text");
    const moe_gpu_counters before = c;
    wait(&c, "cross-entropy loss", 2);
    wait(&c, "sum of squares", 5);
    wait(&c, "download", 2);
    c.allocations += 1;
    char line[256];
    moe_gpu_counters_delta_text(&c, &before, line, sizeof line);
    const char *want = "9 host waits (sum of squares 5, download 2, cross-entropy loss 2); 1 device allocations";
    CHECK(!strcmp(line, want), "delta: '%s', want '%s'", line, want);
    moe_gpu_counters_delta_text(&c, &c, line, sizeof line);
    CHECK(!strcmp(line, "0 host waits; 0 device allocations"), "no change: '%s'", line);
    char reasons[MOE_GPU_WAIT_REASONS + 4][16];
    for (int i = 0; i < MOE_GPU_WAIT_REASONS + 4; i++) {
        snprintf(reasons[i], sizeof reasons[i], "reason %d", i);
        wait(&c, reasons[i], 1);
    }
    CHECK(c.reasons == MOE_GPU_WAIT_REASONS && !strcmp(c.reason[MOE_GPU_WAIT_REASONS - 1], "other"),
          "reasons past the table go to its last slot, 'other' (%d reasons, last '%s')", c.reasons,
          c.reason[MOE_GPU_WAIT_REASONS - 1]);
    moe_gpu_counters_delta_text(&c, &before, line, 8); /* a short buffer: cut, terminated */
    CHECK(strlen(line) == 7, "a short buffer holds '%s'", line);
    return test_finish("test_gpu_counters");
}
