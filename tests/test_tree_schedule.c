/* test_tree_schedule.c — core/tree_schedule.h's schedule, which the CPU and the CUDA experts both follow, against
 * the order expert_ffn.h documents, written here on its own: run symbolically (each buffer holds the expression
 * it was formed by), the gradient g must end as (g + ((s0 + s1) + (s2 + s3))) for 4 segments (the binary tree
 * of tree_reduce.h, left + right) and as (((g + s0) + s1) + s2) for 3 (segment order when the number is not a
 * power of two); every segment's leaf formed once, at its turn, never into the gradient; no buffer read before it
 * is written; buffer numbers within moe_tree_schedule_buffers. No GPU needed.
 * Run: meson test -C build test_tree_schedule */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tree_schedule.h"
#include "tests/test_util.h"

/* "(left+right)" over [lo, hi), a power of two long */
static void tree_expr(int lo, int hi, char *out, size_t cap) {
    if (hi - lo == 1) {
        snprintf(out, cap, "s%d", lo);
        return;
    }
    const int mid = lo + (hi - lo) / 2;
    char *l = malloc(cap), *r = malloc(cap);
    if (!l || !r) abort();
    tree_expr(lo, mid, l, cap), tree_expr(mid, hi, r, cap);
    snprintf(out, cap, "(%s+%s)", l, r);
    free(l), free(r);
}

static void check_schedule(int S) {
    const int nbuf = moe_tree_schedule_buffers(S) + 1; /* the gradient, then the scratch buffers */
    const size_t cap = 32 * (size_t)S + 64;
    char **buf = malloc(nbuf * sizeof *buf), *want = malloc(cap), *tmp = malloc(cap);
    if (nbuf < 2 || !buf || !want || !tmp) abort();
    for (int b = 0; b < nbuf; b++) {
        if (!(buf[b] = malloc(cap))) abort();
        buf[b][0] = 0; /* unwritten */
    }
    strcpy(buf[MOE_TREE_OUT], "g");
    int bad = 0, leaves = 0;
    moe_tree_step steps[MOE_TREE_MAX_STEPS];
    for (int sg = 0; sg <= S && !bad; sg++) {
        const int n = moe_tree_schedule_steps(S, sg, steps);
        if (n < 0 || n > MOE_TREE_MAX_STEPS) bad = 1;
        for (int i = 0; i < n && !bad; i++) {
            const moe_tree_step *st = &steps[i];
            if (st->dst < 0 || st->dst >= nbuf) {
                bad = 1;
                CHECK(0, "segments=%d: step %d of segment %d writes buffer %d of %d", S, i, sg, st->dst, nbuf);
            } else if (st->segment >= 0) {
                bad = st->segment != sg || i != 0 || st->dst == MOE_TREE_OUT;
                CHECK(!bad, "segments=%d: step %d after segment %d forms segment %d's leaf into buffer %d", S, i, sg,
                      st->segment, st->dst);
                snprintf(buf[st->dst], cap, "s%d", st->segment), leaves++;
            } else if (st->left < 0 || st->left >= nbuf || st->right < 0 || st->right >= nbuf ||
                       !buf[st->left][0] || !buf[st->right][0]) {
                bad = 1;
                CHECK(0, "segments=%d: step %d after segment %d reads buffers %d, %d (unwritten or out of range)", S, i,
                      sg, st->left, st->right);
            } else {
                snprintf(tmp, cap, "(%s+%s)", buf[st->left], buf[st->right]);
                strcpy(buf[st->dst], tmp);
            }
        }
    }
    if (!(S & (S - 1))) {
        tree_expr(0, S, tmp, cap);
        snprintf(want, cap, "(g+%s)", tmp);
    } else {
        strcpy(want, "g");
        for (int s = 0; s < S; s++) snprintf(tmp, cap, "(%s+s%d)", want, s), strcpy(want, tmp);
    }
    CHECK(!bad && leaves == S, "segments=%d: %d leaves formed", S, leaves);
    CHECK(!bad && !strcmp(buf[MOE_TREE_OUT], want), "segments=%d: the gradient is %.160s, not %.160s", S,
          buf[MOE_TREE_OUT], want);
    if (S <= 8) printf("segments=%d: %s\n", S, buf[MOE_TREE_OUT]);
    for (int b = 0; b < nbuf; b++) free(buf[b]);
    free(buf), free(want), free(tmp);
}

int main(void) {
    for (int S = 1; S <= 40; S++) check_schedule(S);
    check_schedule(64);
    check_schedule(100);
    check_schedule(256);
    moe_tree_step steps[MOE_TREE_MAX_STEPS];
    CHECK(moe_tree_schedule_steps(0, 0, steps) == -1 && moe_tree_schedule_steps(4, 5, steps) == -1 &&
              moe_tree_schedule_steps(4, -1, steps) == -1,
          "an out-of-range segment or count is accepted");
    CHECK(moe_tree_schedule_buffers(1) == 2 && moe_tree_schedule_buffers(8) == 5 &&
              moe_tree_schedule_buffers(9) == 6,
          "scratch buffers: log2 rounded up plus 2");
    return test_finish("test_tree_schedule");
}
