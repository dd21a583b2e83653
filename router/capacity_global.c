/* capacity_global.c — the capacity rule over the world with O(E + T*k) control traffic per rank, and the
 * receiver's count check (capacity.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "router/capacity.h"

/* An assignment as its expert's decider sees it (drop by score). */
typedef struct {
    moe_real score;
    int token; /* global token index: the tie-break */
    int expert;
} candidate;

/* A decider's answer about one expert to one rank: the C-th best candidate (it and every better one are
 * kept) or keep_all, and how many of that rank's candidates pass. */
typedef struct {
    moe_real score;
    int token;
    int keep_all;
    int kept;
} threshold;

/* a before b: the higher score, then the lower token */
static int better(moe_real score_a, int token_a, moe_real score_b, int token_b) {
    return score_a > score_b || (score_a == score_b && token_a < token_b);
}

static int by_priority(const void *pa, const void *pb) {
    const candidate *a = pa, *b = pb;
    return better(a->score, a->token, b->score, b->token) ? -1 : better(b->score, b->token, a->score, a->token);
}

static int passes(const threshold *t, moe_real score, int token) {
    return t->keep_all || !better(t->score, t->token, score, token);
}

/* Experts decided by world rank q of W: q, q + W, ... below E; expert e is the (e / W)-th of rank e % W. */
static int num_decided(int q, int W, int E) { return q < E ? (E - q + W - 1) / W : 0; }

/* The buffers of one drop-by-score exchange: W ranks, this rank decides `mine` experts. */
typedef struct {
    int W, mine;
    int *rows;             /* [4 W]: candidates sent to / received from each rank, answers to / from each */
    candidate *send, *recv; /* [T k], [received] */
    threshold *reply;      /* [W * mine]: this rank's answers, rank-major */
    threshold *answer;     /* [E]: the answers about every expert, by expert */
    threshold *by_decider; /* [E]: the same as they arrive, decider-major */
} score_exchange;

static void score_exchange_free(score_exchange *x) {
    free(x->rows), free(x->send), free(x->recv), free(x->reply), free(x->answer), free(x->by_decider);
}

/* Every candidate of this rank to its expert's decider: order decider, expert, token. */
static moe_status send_candidates(moe_comm *world, int E, int k, const int *expert, const moe_real *score,
                                  const moe_routing_counts *counts, score_exchange *x, int *received) {
    const int A = counts->num_tokens * k, W = x->W;
    int *send_rows = x->rows, *recv_rows = x->rows + W;
    int *next = malloc((size_t)E * sizeof(int));
    x->send = malloc((size_t)(A ? A : 1) * sizeof *x->send);
    if (!next || !x->send) return free(next), MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0, at = 0; p < W; p++)
        for (int e = p; e < E; e += W) {
            next[e] = at;
            at += counts->num_selected_local[e];
            send_rows[p] += counts->num_selected_local[e];
        }
    for (int a = 0; a < A; a++)
        x->send[next[expert[a]]++] = (candidate){score[a], counts->first_token + a / k, expert[a]};
    free(next);
    MOE_TRY(moe_comm_alltoall_ints(world, send_rows, recv_rows, 1));
    *received = 0;
    for (int q = 0; q < W; q++) *received += recv_rows[q];
    x->recv = malloc((size_t)(*received ? *received : 1) * sizeof *x->recv);
    if (!x->recv) return MOE_ERR_OUT_OF_MEMORY;
    return moe_comm_alltoallv_host_rows(world, x->send, send_rows, x->recv, recv_rows, sizeof(candidate));
}

/* The decider's part: per expert it decides, the C-th best of all candidates, and per rank how many of its
 * candidates pass. */
static moe_status decide(int C, int received, score_exchange *x) {
    const int W = x->W, mine = x->mine;
    int *bucket_at = calloc((size_t)mine + 1, sizeof(int)), *fill = malloc((size_t)(mine ? mine : 1) * sizeof(int));
    candidate *sorted = malloc((size_t)(received ? received : 1) * sizeof *sorted);
    x->reply = calloc((size_t)W * (mine ? mine : 1), sizeof *x->reply);
    if (!bucket_at || !fill || !sorted || !x->reply)
        return free(bucket_at), free(fill), free(sorted), MOE_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < received; i++) bucket_at[x->recv[i].expert / W + 1]++;
    for (int b = 0; b < mine; b++) bucket_at[b + 1] += bucket_at[b];
    memcpy(fill, bucket_at, (size_t)mine * sizeof(int));
    for (int i = 0; i < received; i++) sorted[fill[x->recv[i].expert / W]++] = x->recv[i];
    for (int b = 0; b < mine; b++) {
        const int n = bucket_at[b + 1] - bucket_at[b];
        candidate *c = sorted + bucket_at[b];
        qsort(c, n, sizeof *c, by_priority);
        const threshold bar = n > C ? (threshold){c[C - 1].score, c[C - 1].token, 0, 0} : (threshold){0, 0, 1, 0};
        for (int q = 0; q < W; q++) x->reply[(size_t)q * mine + b] = bar;
    }
    const int *recv_rows = x->rows + W;
    for (int q = 0, i = 0; q < W; q++)
        for (int end = i + recv_rows[q]; i < end; i++) {
            threshold *t = &x->reply[(size_t)q * mine + x->recv[i].expert / W];
            t->kept += passes(t, x->recv[i].score, x->recv[i].token);
        }
    free(bucket_at), free(fill), free(sorted);
    return MOE_OK;
}

/* The answers back to every rank, then this rank's kept flags from them. */
static moe_status receive_answers(moe_comm *world, int E, int k, const int *expert, const moe_real *score,
                                  unsigned char *kept, moe_routing_counts *counts, score_exchange *x) {
    const int W = x->W;
    int *reply_rows = x->rows + 2 * W, *answer_rows = x->rows + 3 * W;
    for (int q = 0; q < W; q++) reply_rows[q] = x->mine, answer_rows[q] = num_decided(q, W, E);
    x->by_decider = malloc((size_t)E * sizeof *x->by_decider);
    x->answer = malloc((size_t)E * sizeof *x->answer);
    if (!x->by_decider || !x->answer) return MOE_ERR_OUT_OF_MEMORY;
    MOE_TRY(moe_comm_alltoallv_host_rows(world, x->reply, reply_rows, x->by_decider, answer_rows, sizeof(threshold)));
    for (int q = 0, i = 0; q < W; q++)
        for (int e = q; e < E; e += W) x->answer[e] = x->by_decider[i++];
    for (int e = 0; e < E; e++) counts->kept_by_decider[e] = x->answer[e].kept;
    for (int a = 0; a < counts->num_tokens * k; a++)
        kept[a] = (unsigned char)passes(&x->answer[expert[a]], score[a], counts->first_token + a / k);
    return MOE_OK;
}

static moe_status keep_by_score(moe_comm *world, int C, int E, int k, const int *expert, const moe_real *score,
                                unsigned char *kept, moe_routing_counts *counts) {
    score_exchange x = {.W = moe_comm_size(world)};
    x.mine = num_decided(moe_comm_rank(world), x.W, E);
    x.rows = calloc((size_t)4 * x.W, sizeof(int));
    int received = 0;
    moe_status st = x.rows ? send_candidates(world, E, k, expert, score, counts, &x, &received) : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = decide(C, received, &x);
    if (st == MOE_OK) st = receive_answers(world, E, k, expert, score, kept, counts, &x);
    score_exchange_free(&x);
    return st;
}

moe_status moe_router_global_capacity(moe_comm *world, float capacity_factor, moe_drop_priority priority,
                                      int num_experts, int top_k, const int *expert, const moe_real *expert_score,
                                      unsigned char *kept, moe_routing_counts *counts) {
    const int E = num_experts, k = top_k, A = counts->num_tokens * k, n = E + 2;
    /* one scan over [T, non-finite flag, selected per expert]: first token, global size, whether any rank's
     * logits were non-finite, counts before this rank, global counts */
    int *scan = calloc((size_t)3 * n, sizeof(int));
    if (!scan) return MOE_ERR_OUT_OF_MEMORY;
    int *in = scan, *before = scan + n, *total = scan + 2 * n;
    in[0] = counts->num_tokens, in[1] = counts->nonfinite_local != 0;
    for (int a = 0; a < A; a++) in[2 + expert[a]]++;
    moe_status st = moe_comm_scan_sum_ints(world, in, before, total, n);
    if (st != MOE_OK) return free(scan), st;
    counts->first_token = before[0], counts->num_tokens_global = total[0], counts->nonfinite_ranks = total[1];
    for (int e = 0; e < E; e++) {
        counts->num_selected_local[e] = in[2 + e];
        counts->num_selected_before[e] = before[2 + e];
        counts->num_selected_per_expert[e] = total[2 + e];
        counts->kept_by_decider[e] = 0;
    }
    free(scan);
    const int C = counts->capacity = moe_router_capacity(capacity_factor, counts->num_tokens_global, k, E);
    if (C > 0 && priority == MOE_DROP_BY_SCORE) {
        MOE_TRY(keep_by_score(world, C, E, k, expert, expert_score, kept, counts));
    } else {
        /* dropless, or token order: the assignment's place in its expert's global queue decides */
        int *place = counts->num_tokens_per_expert; /* as a running count; rewritten below */
        for (int e = 0; e < E; e++) place[e] = counts->num_selected_before[e];
        for (int a = 0; a < A; a++) kept[a] = C == 0 || place[expert[a]]++ < C;
    }
    counts->total_kept = 0;
    for (int e = 0; e < E; e++) counts->num_tokens_per_expert[e] = 0;
    for (int a = 0; a < A; a++) counts->num_tokens_per_expert[expert[a]] += kept[a];
    for (int e = 0; e < E; e++) counts->total_kept += counts->num_tokens_per_expert[e];
    counts->total_dropped = A - counts->total_kept;
    return MOE_OK;
}

void moe_router_count_witness(const moe_routing_counts *counts, int num_experts, int *witness) {
    for (int e = 0; e < num_experts; e++) {
        int *w = witness + (size_t)e * MOE_COUNT_WITNESS_INTS;
        w[0] = counts->num_selected_local[e];
        w[1] = counts->num_selected_before[e];
        w[2] = counts->kept_by_decider[e];
    }
}

/* What the rule lets a sender with this witness send for one expert. */
static int allowed_rows(const int *w, int capacity, moe_drop_priority priority) {
    if (capacity == 0) return w[0];
    if (priority == MOE_DROP_BY_SCORE) return w[2];
    const int room = capacity - w[1];
    return room < 0 ? 0 : room < w[0] ? room : w[0];
}

moe_status moe_router_check_announced(const moe_dispatch_plan *plan, const moe_routing_counts *counts,
                                      moe_drop_priority priority, moe_ranks ranks, int layer_index) {
    const int EL = plan->num_local_experts;
    char text[3000];
    size_t at = 0;
    int bad = 0;
    for (int p = 0; p < plan->ep_size; p++)
        for (int le = 0; le < EL; le++) {
            const int i = p * EL + le, got = plan->recv_counts[i];
            const int want =
                allowed_rows(plan->witness + (size_t)i * MOE_COUNT_WITNESS_INTS, counts->capacity, priority);
            if (got == want) continue;
            if (bad++ < 8 && at < sizeof text)
                at += (size_t)snprintf(text + at, sizeof text - at,
                                       "%sEP rank %d announces %d rows for expert %d, the "
                                       "global routing says %d",
                                       bad > 1 ? "; " : "", p, got, ranks.ep_rank * EL + le, want);
        }
    if (!bad) return MOE_OK;
    return moe_fail(MOE_ERR_COUNT_MISMATCH, "layer %d: count mismatch on world rank %d (EP rank %d): %s%s", layer_index,
                    ranks.world_rank, ranks.ep_rank, text, bad > 8 ? "; ..." : "");
}
