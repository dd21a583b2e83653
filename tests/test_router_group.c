/* test_router_group.c — group-limited routing (router/group.h, DeepSeek-V3's n_group / topk_group), exactly: a token's
 * groups scored by the sum of their two best selection scores, the best topk_groups kept (ties to the lower group),
 * -inf elsewhere, so that top-k chooses among them; in place as out of place; groups scored by their best alone
 * (DeepSeek-V2's group_limited_greedy) keeping other groups than the sums would, and groups of one expert; and the
 * configurations moe_config_problem refuses, each by its field. Run: meson test -C build test_router_group */
#include <math.h>
#include <string.h>

#include "moe/moe.h"
#include "router/gates.h"
#include "router/group.h"
#include "router/topk.h"
#include "tests/test_util.h"

static void by_hand(void) {
    /* 4 groups of 2: sums 0.3, 0.9, 0.95, 0.6 -> groups 2 and 1; a group's single best (0.9 in group 1) does not
     * decide: its sum does */
    const moe_real s[8] = {0.1f, 0.2f, 0.9f, 0.0f, 0.5f, 0.45f, 0.3f, 0.3f};
    moe_real masked[8];
    moe_router_group_mask_cpu(s, 1, 8, 4, 2, MOE_GROUP_SCORE_TOP2, masked);
    for (int e = 0; e < 8; e++) {
        const int kept = e / 2 == 1 || e / 2 == 2;
        CHECK(kept ? masked[e] == s[e] : isinf(masked[e]) && masked[e] < 0, "expert %d: %g", e, (double)masked[e]);
    }
    int expert[2];
    moe_router_topk_cpu(masked, 1, 8, 2, expert);
    CHECK(expert[0] == 2 && expert[1] == 4, "top-2 among the kept groups: %d, %d (want 2, 4)", expert[0], expert[1]);
    /* a tie between groups' sums: the lower group; in place */
    moe_real tie[6] = {0.5f, 0.1f, 0.3f, 0.3f, 0.6f, 0.0f}; /* sums 0.6, 0.6, 0.6: group 0 */
    moe_router_group_mask_cpu(tie, 1, 6, 3, 1, MOE_GROUP_SCORE_TOP2, tie);
    CHECK(tie[0] == 0.5f && tie[1] == 0.1f && isinf(tie[2]) && isinf(tie[3]) && isinf(tie[4]) && isinf(tie[5]),
          "a tie of group sums goes to the lower group (in place)");
    /* DeepSeek-V2's group_limited_greedy: a group's best alone; the same scores keep groups 1 (0.9) and 2 (0.5) -- and
     * with group 2's pair (0.5, 0.45) against group 3's (0.3, 0.55) the max picks group 3 where the sum would not */
    const moe_real v2[8] = {0.1f, 0.2f, 0.9f, 0.0f, 0.5f, 0.45f, 0.3f, 0.55f};
    moe_router_group_mask_cpu(v2, 1, 8, 4, 2, MOE_GROUP_SCORE_MAX, masked);
    for (int e = 0; e < 8; e++) {
        const int kept = e / 2 == 1 || e / 2 == 3;
        CHECK(kept ? masked[e] == v2[e] : isinf(masked[e]) && masked[e] < 0, "max: expert %d: %g", e,
              (double)masked[e]);
    }
    moe_router_group_mask_cpu(v2, 1, 8, 4, 2, MOE_GROUP_SCORE_TOP2, masked); /* sums 0.3, 0.9, 0.95, 0.85 */
    CHECK(!isinf(masked[4]) && isinf(masked[6]), "top2: group 2 kept, group 3 not");
    moe_router_group_mask_cpu(v2, 1, 8, 8, 3, MOE_GROUP_SCORE_MAX, masked); /* groups of 1: the 3 best experts kept */
    for (int e = 0; e < 8; e++) {
        const int kept = e == 2 || e == 4 || e == 7;
        CHECK(kept ? masked[e] == v2[e] : isinf(masked[e]) && masked[e] < 0, "max, groups of 1: expert %d: %g", e,
              (double)masked[e]);
    }
    printf("by hand: groups 1 and 2 of 4 kept, top-2 = experts 2, 4; a tie to group 0; max keeps groups 1 and 3\n");
}

static void refusals(void) {
    const struct { int E, k, groups, topk_groups; const char *expect; } bad[] = {
        {8, 2, 3, 1, "num_groups (n_group) must divide the number of experts"},
        {8, 2, 8, 2, "at least 2 experts per group"},
        {8, 2, 4, 5, "topk_groups (topk_group) must be between 1 and num_groups"},
        {8, 6, 4, 2, "top_k must be at most topk_groups x the experts of a group"},
        {8, 2, 0, 2, "topk_groups (topk_group) needs num_groups (n_group) > 1"},
        {256, 8, 65, 4, "num_groups (n_group) must be between 0 (none) and 64"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        moe_config c = moe_config_default(16, 32, bad[i].E, bad[i].k);
        c.num_groups = bad[i].groups, c.topk_groups = bad[i].topk_groups;
        const char *problem = moe_config_problem(&c);
        CHECK(problem && strstr(problem, bad[i].expect), "E %d k %d groups %d/%d: %s", bad[i].E, bad[i].k,
              bad[i].topk_groups, bad[i].groups, problem ? problem : "accepted");
        if (problem) printf("refused: %s\n", problem);
    }
    moe_config single = moe_config_default(16, 32, 8, 1); /* groups of 1 expert: well defined by the max alone */
    single.num_groups = 8, single.topk_groups = 2, single.group_score = MOE_GROUP_SCORE_MAX;
    CHECK(!moe_config_problem(&single), "groups of 1 under max refused: %s", moe_config_problem(&single));
    moe_config ok = moe_config_default(16, 32, 256, 8);
    ok.num_groups = 8, ok.topk_groups = 4, ok.routed_scaling = 2.5f; /* DeepSeek-V3's */
    CHECK(!moe_config_problem(&ok), "DeepSeek-V3's routing refused: %s", moe_config_problem(&ok));
    ok.routed_scaling = -1;
    CHECK(moe_config_problem(&ok) && strstr(moe_config_problem(&ok), "routed_scaling"), "a negative scale accepted");
}

/* DeepSeek's renormalised sigmoid gates when the chosen experts' scores all underflow to 0 (logits below about -88,
 * chosen by their selection bias): gates of 0 and finite gradients, as transformers' sum + 1e-20 gives (a probe,
 * 2026-12-07: 0 / 0, NaN from finite weights); ordinary scores keep their bits (the 1e-20 is below half an ulp). */
static void underflowed_scores(void) {
    const moe_real zero[4] = {0, 0, 0.25f, 0.5f}, dgate[2] = {1, -2};
    const int chosen[2] = {0, 1}, others[2] = {2, 3};
    moe_real score[2], gate[2], dscores[4] = {0};
    moe_router_gates_cpu(zero, chosen, 1, 4, 2, 1, 2.5f, score, gate);
    CHECK(gate[0] == 0 && gate[1] == 0, "gates of two zero scores: %g %g", (double)gate[0], (double)gate[1]);
    moe_router_gates_backward_cpu(zero, chosen, dgate, 1, 4, 2, 1, 2.5f, dscores);
    for (int i = 0; i < 4; i++) CHECK(isfinite(dscores[i]), "dscores[%d] is %g", i, (double)dscores[i]);
    moe_router_gates_cpu(zero, others, 1, 4, 2, 1, 1, score, gate);
    CHECK(gate[0] == 0.25f / 0.75f && gate[1] == 0.5f / 0.75f, "ordinary gates changed: %.9g %.9g", (double)gate[0],
          (double)gate[1]);
}

int main(void) {
    by_hand();
    refusals();
    underflowed_scores();
    return test_finish("test_router_group");
}
