/* test_rank_grid.c — pipeline/grid.h's rank grid: for every world W in 1..16 and every valid (pp, ep, tp), each
 * rank's coordinates against two independent enumerations (nested loops pp, dp, tp and pp, edp, ep counting ranks
 * up: the dense and the MoE reading of a stage), and each group kind against its definition (the members agree on
 * the coordinates the kind fixes and run through the one it varies, in order; every member sees the same list at its
 * own position), so each kind partitions the world; with pp = tp = 1 the layout of old (ep_rank = rank % ep,
 * edp_rank = rank / ep); pipeline neighbours W / pp apart; groups written out by hand; the refusals with their
 * messages; the print line; and finally layouts broken on purpose, which the checks must catch.
 * Run: meson test -C build test_rank_grid */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "pipeline/grid.h"
#include "tests/test_util.h"

enum { MAX_WORLD = 16 };

/* ---- one world's layout as the API gives it, rank by rank, so that a check can also be fed a broken one ---- */

typedef struct {
    int world, pp, ep, tp;
    moe_rank_grid g[MAX_WORLD];
    int count[MAX_WORLD][MOE_RANK_GROUP_COUNT];
    int position[MAX_WORLD][MOE_RANK_GROUP_COUNT];
    int members[MAX_WORLD][MOE_RANK_GROUP_COUNT][MAX_WORLD];
} layout;

static int layout_build(layout *l, int world, int pp, int ep, int tp) {
    memset(l, 0, sizeof *l);
    l->world = world, l->pp = pp, l->ep = ep, l->tp = tp;
    for (int r = 0; r < world; r++) {
        const moe_status status = moe_rank_grid_make(world, pp, ep, tp, r, &l->g[r]);
        CHECK(status == MOE_OK, "W %d pp %d ep %d tp %d rank %d: %s", world, pp, ep, tp, r,
              moe_failure_message(status));
        if (status != MOE_OK) return 0;
        for (int k = 0; k < MOE_RANK_GROUP_COUNT; k++) {
            const int size = moe_rank_grid_group_size(&l->g[r], (moe_rank_group)k);
            if (size < 0 || size > MAX_WORLD) {
                CHECK(0, "W %d rank %d: %s group of size %d", world, r, moe_rank_grid_group_name(k), size);
                return 0;
            }
            l->count[r][k] = moe_rank_grid_group(&l->g[r], (moe_rank_group)k, l->members[r][k]);
            CHECK(l->count[r][k] == size, "W %d rank %d: %s group lists %d ranks, its size says %d", world, r,
                  moe_rank_grid_group_name(k), l->count[r][k], size);
            l->position[r][k] = moe_rank_grid_group_rank(&l->g[r], (moe_rank_group)k);
        }
    }
    return 1;
}

/* The coordinates: 0 pp, 1 stage, 2 dp, 3 tp, 4 edp, 5 ep. The one a kind varies (its members' position), and the
 * ones it fixes. */
enum { COORDS = 6 };
static const char *const coord_name[COORDS] = {"pp", "stage", "dp", "tp", "edp", "ep"};
static const int varies[MOE_RANK_GROUP_COUNT] = {
    [MOE_RANK_GROUP_PIPELINE] = 0, [MOE_RANK_GROUP_STAGE] = 1, [MOE_RANK_GROUP_DATA] = 2,
    [MOE_RANK_GROUP_TENSOR] = 3,   [MOE_RANK_GROUP_EXPERT_DP] = 4, [MOE_RANK_GROUP_EP] = 5,
};
static int fixes(int kind, int c) {
    switch (kind) {
    case MOE_RANK_GROUP_PIPELINE: return c != 0;
    case MOE_RANK_GROUP_STAGE: return c == 0;
    case MOE_RANK_GROUP_DATA: return c == 0 || c == 3;
    case MOE_RANK_GROUP_TENSOR: return c == 0 || c == 2;
    case MOE_RANK_GROUP_EXPERT_DP: return c == 0 || c == 5;
    case MOE_RANK_GROUP_EP: return c == 0 || c == 4;
    default: return 0;
    }
}

/* Every property the grid promises, against the layout's sizes and enumerations of the ranks that share no formula
 * with grid.c. Returns the problems found. */
static int layout_problems(const layout *l) {
    const int W = l->world, pp = l->pp, ep = l->ep, tp = l->tp, Ws = W / pp, dp = Ws / tp, edp = Ws / ep;
    const int size[MOE_RANK_GROUP_COUNT] = {[MOE_RANK_GROUP_PIPELINE] = pp, [MOE_RANK_GROUP_STAGE] = Ws,
                                            [MOE_RANK_GROUP_EP] = ep,       [MOE_RANK_GROUP_EXPERT_DP] = edp,
                                            [MOE_RANK_GROUP_TENSOR] = tp,   [MOE_RANK_GROUP_DATA] = dp};
    int coord[MAX_WORLD][COORDS], r = 0;
    for (int a = 0; a < pp; a++)
        for (int s = 0; s < Ws; s++, r++) coord[r][0] = a, coord[r][1] = s;
    r = 0;
    for (int a = 0; a < pp; a++)
        for (int b = 0; b < dp; b++)
            for (int t = 0; t < tp; t++, r++) coord[r][2] = b, coord[r][3] = t;
    r = 0;
    for (int a = 0; a < pp; a++)
        for (int b = 0; b < edp; b++)
            for (int e = 0; e < ep; e++, r++) coord[r][4] = b, coord[r][5] = e;
    test_problems = 0;
    for (r = 0; r < W; r++) {
        const moe_rank_grid *g = &l->g[r];
        const int got[COORDS] = {g->pp_rank, g->stage_rank, g->dp_rank, g->tp_rank, g->edp_rank, g->ep_rank};
        if (g->world != W || g->pp != pp || g->dp != dp || g->edp != edp || g->ep != ep || g->tp != tp || g->rank != r)
            test_problem("W %d rank %d: sizes W %d pp %d dp %d edp %d ep %d tp %d rank %d, want W %d pp %d dp %d edp "
                         "%d ep %d tp %d", W, r, g->world, g->pp, g->dp, g->edp, g->ep, g->tp, g->rank, W, pp, dp, edp,
                         ep, tp);
        for (int c = 0; c < COORDS; c++)
            if (got[c] != coord[r][c])
                test_problem("W %d pp %d ep %d tp %d rank %d: %s coordinate %d, want %d", W, pp, ep, tp, r,
                             coord_name[c], got[c], coord[r][c]);
        if (moe_rank_grid_rank_at(g, g->pp_rank, g->dp_rank, g->tp_rank) != r ||
            moe_rank_grid_expert_rank_at(g, g->pp_rank, g->edp_rank, g->ep_rank) != r)
            test_problem("W %d rank %d: its coordinates go back to ranks %d (dense) and %d (experts)", W, r,
                         moe_rank_grid_rank_at(g, g->pp_rank, g->dp_rank, g->tp_rank),
                         moe_rank_grid_expert_rank_at(g, g->pp_rank, g->edp_rank, g->ep_rank));
        if (pp == 1 && tp == 1 && (g->ep_rank != r % ep || g->edp_rank != r / ep))
            test_problem("W %d ep %d rank %d: ep %d edp %d, the old layout has ep %d edp %d", W, ep, r, g->ep_rank,
                         g->edp_rank, r % ep, r / ep);
        for (int k = 0; k < MOE_RANK_GROUP_COUNT; k++) {
            const char *name = moe_rank_grid_group_name(k);
            const int n = l->count[r][k], *m = l->members[r][k];
            if (n != size[k]) {
                test_problem("W %d pp %d ep %d tp %d rank %d: %s group of %d, want %d", W, pp, ep, tp, r, name, n,
                             size[k]);
                continue;
            }
            int at = -1;
            for (int i = 0; i < n; i++) {
                if (m[i] < 0 || m[i] >= W || (i && m[i] <= m[i - 1])) {
                    test_problem("W %d rank %d: %s group's member %d is rank %d, not ascending within 0 .. %d", W, r,
                                 name, i, m[i], W - 1);
                    break;
                }
                if (m[i] == r) at = i;
                for (int c = 0; c < COORDS; c++)
                    if (fixes(k, c) && coord[m[i]][c] != coord[r][c])
                        test_problem("W %d pp %d ep %d tp %d rank %d: %s group holds rank %d of another %s", W, pp, ep,
                                     tp, r, name, m[i], coord_name[c]);
                if (coord[m[i]][varies[k]] != i)
                    test_problem("W %d rank %d: %s group's member %d is rank %d, whose coordinate is %d", W, r, name, i,
                                 m[i], coord[m[i]][varies[k]]);
                /* partition: each member sees this very list, itself at its own index */
                if (m[i] >= 0 && m[i] < W &&
                    (l->count[m[i]][k] != n || memcmp(l->members[m[i]][k], m, n * sizeof *m) ||
                     l->position[m[i]][k] != i))
                    test_problem("W %d pp %d ep %d tp %d: ranks %d and %d see different %s groups (or positions)", W,
                                 pp, ep, tp, r, m[i], name);
            }
            if (at < 0 || l->position[r][k] != at)
                test_problem("W %d rank %d: at position %d of its %s group, which lists it at %d", W, r,
                             l->position[r][k], name, at);
            if (k == MOE_RANK_GROUP_PIPELINE)
                for (int i = 1; i < n; i++)
                    if (m[i] - m[i - 1] != Ws)
                        test_problem("W %d pp %d rank %d: pipeline neighbours %d and %d are not %d apart", W, pp, r,
                                     m[i - 1], m[i], Ws);
        }
    }
    /* the groups of each kind number W / size: the partition is counted, not just implied */
    for (int k = 0; k < MOE_RANK_GROUP_COUNT; k++) {
        int groups = 0;
        for (r = 0; r < W; r++) groups += l->count[r][k] > 0 && l->members[r][k][0] == r;
        if (size[k] && groups != W / size[k])
            test_problem("W %d pp %d ep %d tp %d: %d %s groups, want %d", W, pp, ep, tp, groups,
                         moe_rank_grid_group_name(k), W / size[k]);
    }
    return test_problems;
}

static void test_every_grid(void) {
    static layout l;
    int grids = 0;
    for (int W = 1; W <= MAX_WORLD; W++)
        for (int pp = 1; pp <= W; pp++)
            for (int tp = 1; tp <= W; tp++)
                for (int ep = 1; ep <= W; ep++) {
                    if (W % pp || (W / pp) % tp || (W / pp) % ep) continue;
                    if (!layout_build(&l, W, pp, ep, tp)) continue;
                    const int found = layout_problems(&l);
                    CHECK(found == 0, "W %d pp %d ep %d tp %d: %d problems", W, pp, ep, tp, found);
                    grids++;
                }
    /* the (pp, tp, ep) with pp dividing W and tp, ep each dividing W / pp, W 1..16: sum of d(W / pp)^2 */
    CHECK(grids == 314, "%d grids checked, want 314", grids);
    printf("properties hold for %d grids (W 1..16, every pp, ep, tp)\n", grids);
}

/* ---- written out by hand from the formula in grid.h, not from the code's output ---- */

static void check_group(const moe_rank_grid *g, moe_rank_group kind, int position, int n, const int *want) {
    int got[MAX_WORLD];
    const int count = moe_rank_grid_group(g, kind, got);
    CHECK(count == n && !memcmp(got, want, n * sizeof *want) && moe_rank_grid_group_rank(g, kind) == position,
          "W %d rank %d: %s group of %d starting %d at position %d, want %d starting %d at %d", g->world, g->rank,
          moe_rank_grid_group_name(kind), count, count ? got[0] : -1, moe_rank_grid_group_rank(g, kind), n, want[0],
          position);
}

static void test_hand_worked(void) {
    moe_rank_grid g;
    /* W 8, pp 2, ep 2, tp 2: stages of 4. Rank 5 = 1·4 + 1: stage 1 (ranks 4..7), stage rank 1 = dp 0·2 + tp 1 =
     * edp 0·2 + ep 1. */
    CHECK_OK(moe_rank_grid_make(8, 2, 2, 2, 5, &g));
    CHECK(g.dp == 2 && g.edp == 2 && g.pp_rank == 1 && g.stage_rank == 1 && g.dp_rank == 0 && g.tp_rank == 1 &&
              g.edp_rank == 0 && g.ep_rank == 1,
          "W 8 pp 2 ep 2 tp 2 rank 5: dp %d edp %d, (pp %d, stage %d, dp %d, tp %d, edp %d, ep %d)", g.dp, g.edp,
          g.pp_rank, g.stage_rank, g.dp_rank, g.tp_rank, g.edp_rank, g.ep_rank);
    check_group(&g, MOE_RANK_GROUP_PIPELINE, 1, 2, (int[]){1, 5});
    check_group(&g, MOE_RANK_GROUP_STAGE, 1, 4, (int[]){4, 5, 6, 7});
    check_group(&g, MOE_RANK_GROUP_EP, 1, 2, (int[]){4, 5});
    check_group(&g, MOE_RANK_GROUP_EXPERT_DP, 0, 2, (int[]){5, 7});
    check_group(&g, MOE_RANK_GROUP_TENSOR, 1, 2, (int[]){4, 5});
    check_group(&g, MOE_RANK_GROUP_DATA, 0, 2, (int[]){5, 7});
    /* W 16, pp 2, ep 2, tp 2: stages of 8. Rank 11: stage 1 (8..15), stage rank 3 = dp 1·2 + tp 1 = edp 1·2 + ep
     * 1. */
    CHECK_OK(moe_rank_grid_make(16, 2, 2, 2, 11, &g));
    check_group(&g, MOE_RANK_GROUP_PIPELINE, 1, 2, (int[]){3, 11});
    check_group(&g, MOE_RANK_GROUP_STAGE, 3, 8, (int[]){8, 9, 10, 11, 12, 13, 14, 15});
    check_group(&g, MOE_RANK_GROUP_EP, 1, 2, (int[]){10, 11});
    check_group(&g, MOE_RANK_GROUP_EXPERT_DP, 1, 4, (int[]){9, 11, 13, 15});
    check_group(&g, MOE_RANK_GROUP_TENSOR, 1, 2, (int[]){10, 11});
    check_group(&g, MOE_RANK_GROUP_DATA, 1, 4, (int[]){9, 11, 13, 15});
    /* W 8, ep 4, tp 2 (an expert group spans two tensor groups): rank 6 = dp 3·2 + tp 0 = edp 1·4 + ep 2 */
    CHECK_OK(moe_rank_grid_make(8, 1, 4, 2, 6, &g));
    check_group(&g, MOE_RANK_GROUP_EP, 2, 4, (int[]){4, 5, 6, 7});
    check_group(&g, MOE_RANK_GROUP_EXPERT_DP, 1, 2, (int[]){2, 6});
    check_group(&g, MOE_RANK_GROUP_TENSOR, 0, 2, (int[]){6, 7});
    check_group(&g, MOE_RANK_GROUP_DATA, 3, 4, (int[]){0, 2, 4, 6});
    /* the old layout, W 8 ep 4: rank 6 is ep 2 of block 1 (ranks 4..7), expert-dp with rank 2; tp 1: data = stage */
    CHECK_OK(moe_rank_grid_make(8, 1, 4, 1, 6, &g));
    check_group(&g, MOE_RANK_GROUP_EP, 2, 4, (int[]){4, 5, 6, 7});
    check_group(&g, MOE_RANK_GROUP_EXPERT_DP, 1, 2, (int[]){2, 6});
    check_group(&g, MOE_RANK_GROUP_STAGE, 6, 8, (int[]){0, 1, 2, 3, 4, 5, 6, 7});
    check_group(&g, MOE_RANK_GROUP_PIPELINE, 0, 1, (int[]){6});
    check_group(&g, MOE_RANK_GROUP_TENSOR, 0, 1, (int[]){6});
    check_group(&g, MOE_RANK_GROUP_DATA, 6, 8, (int[]){0, 1, 2, 3, 4, 5, 6, 7});
    /* an unknown kind: nothing */
    int none[1] = {-7};
    CHECK(moe_rank_grid_group(&g, MOE_RANK_GROUP_COUNT, none) == 0 && none[0] == -7 &&
              moe_rank_grid_group_size(&g, MOE_RANK_GROUP_COUNT) == 0 &&
              moe_rank_grid_group_rank(&g, MOE_RANK_GROUP_COUNT) == -1 &&
              !strcmp(moe_rank_grid_group_name(MOE_RANK_GROUP_COUNT), "?"),
          "an unknown group kind");
}

static void test_print(void) {
    moe_rank_grid g;
    CHECK_OK(moe_rank_grid_make(8, 2, 2, 1, 5, &g));
    char got[256] = "";
    FILE *f = tmpfile();
    if (!f) {
        CHECK(0, "no temporary file");
        return;
    }
    moe_rank_grid_print(f, &g);
    rewind(f);
    if (!fgets(got, sizeof got, f)) got[0] = 0;
    fclose(f);
    const char *want =
        "grid: 8 ranks = pp 2 x (tp 1 x dp 4 | ep 2 x edp 2); rank 5: stage 1, tp 0, dp 1, ep 1, edp 0\n";
    CHECK(!strcmp(got, want), "printed \"%s\", want \"%s\"", got, want);
    fputs(got, stdout);
}

/* ---- refusals ---- */

static void check_refused(int world, int pp, int ep, int tp, int rank, moe_status want, const char *message) {
    moe_rank_grid g;
    memset(&g, 0xff, sizeof g); /* a refusal must zero it */
    moe_failure_clear();
    const moe_status status = moe_rank_grid_make(world, pp, ep, tp, rank, &g);
    const char *got = moe_failure_message(status);
    const moe_rank_grid zero = {0};
    CHECK(status == want && strstr(got, message) && !memcmp(&g, &zero, sizeof g),
          "W %d pp %d ep %d tp %d rank %d: status %s, message \"%s\" (want %s, containing \"%s\")", world, pp, ep, tp,
          rank, moe_status_string(status), got, moe_status_string(want), message);
    printf("refused: %s\n", got);
}

static void test_refusals(void) {
    const moe_status bad = MOE_ERR_INVALID_CONFIG;
    check_refused(0, 1, 1, 1, 0, bad, "0 ranks in the world; want 1 or more");
    check_refused(8, 0, 1, 1, 0, bad, "pp = 0 pipeline stages; want 1 or more");
    check_refused(8, 1, -1, 1, 0, bad, "ep = -1; want 1 or more");
    check_refused(8, 1, 1, 0, 0, bad, "tp = 0; want 1 or more");
    check_refused(8, 3, 1, 1, 0, bad, "pp = 3 pipeline stages do not divide the 8 ranks");
    check_refused(12, 2, 1, 4, 0, bad, "tp = 4 does not divide the 6 ranks of a stage (12 ranks / pp 2)");
    check_refused(12, 2, 4, 1, 0, bad, "ep = 4 does not divide the 6 ranks of a stage (12 ranks / pp 2)");
    check_refused(8, 2, 2, 2, 8, bad, "rank 8 is outside 0 .. 7");
    check_refused(8, 2, 2, 2, -1, bad, "rank -1 is outside 0 .. 7");
    /* sizes whose product would overflow an int are refused by division, not wrapped */
    check_refused(1 << 30, 1 << 16, 1, 1 << 16, 0, bad, "does not divide");
    moe_failure_clear();
    const moe_status status = moe_rank_grid_make(8, 1, 1, 1, 0, NULL);
    CHECK(status == MOE_ERR_INVALID_ARG && strstr(moe_failure_message(status), "no grid"), "NULL grid: %s",
          moe_failure_message(status));
}

/* ---- layouts broken on purpose: the checks must find each ---- */

static void expect_caught(const char *what, const layout *l) {
    printf("broken on purpose: %s\n", what);
    test_expecting_problems = 1;
    const int found = layout_problems(l);
    test_expecting_problems = 0;
    CHECK(found > 0, "%s: not caught", what);
}

static void test_broken_layouts(void) {
    static layout l;
    if (layout_build(&l, 8, 2, 2, 2)) { /* rank 5's EP group {4, 5} names 6 for 4 */
        l.members[5][MOE_RANK_GROUP_EP][0] = 6;
        expect_caught("W 8 pp 2 ep 2 tp 2: rank 5's EP group lists rank 6 for rank 4", &l);
    }
    if (layout_build(&l, 8, 1, 2, 1)) { /* rank 2 (edp 1, ep 0) says edp 0, ep 1 */
        l.g[2].ep_rank = 1, l.g[2].edp_rank = 0;
        expect_caught("W 8 ep 2: rank 2 claims rank 1's coordinates", &l);
    }
    if (layout_build(&l, 8, 1, 4, 1)) { /* rank 1's EP group built column-wise: {1, 5} (an expert-dp group) */
        l.count[1][MOE_RANK_GROUP_EP] = 2;
        l.members[1][MOE_RANK_GROUP_EP][0] = 1, l.members[1][MOE_RANK_GROUP_EP][1] = 5;
        expect_caught("W 8 ep 4: rank 1's EP group is its expert-dp group", &l);
    }
    if (layout_build(&l, 12, 3, 1, 2)) { /* every pipeline group of rank 0 strides 2 instead of 4 */
        int *m = l.members[0][MOE_RANK_GROUP_PIPELINE];
        m[1] = 2, m[2] = 4;
        expect_caught("W 12 pp 3 tp 2: rank 0's pipeline group {0, 2, 4}", &l);
    }
    if (layout_build(&l, 16, 2, 2, 2)) { /* rank 11 reports position 0 in its tensor group {10, 11} */
        l.position[11][MOE_RANK_GROUP_TENSOR] = 0;
        expect_caught("W 16 pp 2 ep 2 tp 2: rank 11 at position 0 of its tensor group", &l);
    }
    if (layout_build(&l, 4, 1, 2, 1)) { /* the old layout transposed: ep = rank / edp, edp = rank % edp */
        for (int r = 0; r < 4; r++) l.g[r].ep_rank = r / 2, l.g[r].edp_rank = r % 2;
        expect_caught("W 4 ep 2: ep and edp coordinates transposed", &l);
    }
    if (layout_build(&l, 8, 1, 4, 2)) { /* the unfolded layout's EP group for rank 3: {1, 3, 5, 7} (stride tp) */
        int *m = l.members[3][MOE_RANK_GROUP_EP];
        m[0] = 1, m[1] = 3, m[2] = 5, m[3] = 7;
        expect_caught("W 8 ep 4 tp 2: rank 3's EP group strides over the tensor groups", &l);
    }
    if (layout_build(&l, 8, 1, 2, 4)) { /* rank 2's data group {2, 6} named as its tensor group */
        l.count[2][MOE_RANK_GROUP_TENSOR] = 2;
        l.members[2][MOE_RANK_GROUP_TENSOR][0] = 2, l.members[2][MOE_RANK_GROUP_TENSOR][1] = 6;
        expect_caught("W 8 ep 2 tp 4: rank 2's tensor group is its data group", &l);
    }
}

int main(void) {
    test_every_grid();
    test_hand_worked();
    test_print();
    test_refusals();
    test_broken_layouts();
    return test_finish("test_rank_grid");
}
