/* test_pp_schedule.c — pipeline/schedule.h's 1F1B and interleaved 1F1B schedules: against lists worked out by
 * hand, then for every shape p in {1, 2, 4, 8}, V in {1, 2, 4}, m in 1..16 against the properties a runtime needs
 * (each rank's own list: every (micro-batch, chunk) forward once and backward once, forward first, its exchanges
 * with the right peers, the stash no larger than the formula; all ranks together, run as a simulated pipeline with
 * non-blocking sends and blocking receives: no deadlock, every receive matched by a send from the rank it names,
 * a micro-batch's forwards through virtual stages 0 .. pV - 1 in order and its backwards in reverse; and again on a
 * transport that runs each rank's posts in order, without tags, as NCCL does, posted as the runtime posts them), the
 * refusals with their messages, and finally schedules broken on purpose, which the checks must catch.
 * Run: meson test -C build test_pp_schedule */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "pipeline/schedule.h"
#include "tests/test_util.h"

enum { MAX_STAGES = 8 };

/* ---- a compact text of a list, for the hand-worked schedules: F<mb>.<chunk>, B<mb>.<chunk>, and exchanges
 * ra/sa (activation) and rg/sg (gradient) <mb>.<chunk>, with <peer (received from) or >peer (sent to) ---- */

static const char *op_name(moe_pp_op op) {
    static const char *const names[MOE_PP_OP_COUNT] = {
        [MOE_PP_FORWARD] = "F",          [MOE_PP_BACKWARD] = "B",
        [MOE_PP_RECV_ACTIVATION] = "ra", [MOE_PP_SEND_ACTIVATION] = "sa",
        [MOE_PP_RECV_GRADIENT] = "rg",   [MOE_PP_SEND_GRADIENT] = "sg",
    };
    return op >= 0 && op < MOE_PP_OP_COUNT ? names[op] : "?";
}

static void compact(const moe_pp_step *st, int n, char *out, size_t cap) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < n && len < cap; i++) {
        const int recv = st[i].op == MOE_PP_RECV_ACTIVATION || st[i].op == MOE_PP_RECV_GRADIENT;
        const int send = st[i].op == MOE_PP_SEND_ACTIVATION || st[i].op == MOE_PP_SEND_GRADIENT;
        len += snprintf(out + len, cap - len, "%s%s%d.%d", i ? " " : "",
                        op_name(st[i].op), st[i].micro_batch, st[i].chunk);
        if ((recv || send) && len < cap) len += snprintf(out + len, cap - len, "%c%d", recv ? '<' : '>', st[i].peer);
    }
}

static void check_hand_worked(int p, int V, int m, int stage, const char *want) {
    const moe_pp_shape shape = {p, V, m};
    moe_pp_step *steps = NULL;
    int n = 0;
    CHECK_OK(moe_pp_schedule(&shape, stage, &steps, &n));
    char got[4096];
    compact(steps, n, got, sizeof got);
    CHECK(!strcmp(got, want), "p %d V %d m %d rank %d:\n  got  %s\n  want %s", p, V, m, stage, got, want);
    free(steps);
}

/* Worked on paper from the rules in schedule.h, not from the code's output.
 * 1F1B: rank s runs w = min(p - s - 1, m) forwards, then (F k + w, B k) for k < m - w, then the remaining B.
 * Rank 0 is virtual stage 0: no receive before a forward, no send after a backward; the last rank receives no
 * gradient and sends no activation; a middle rank does all four. Neighbours: s - 1 before, s + 1 after.
 * Interleaved, p 2 V 2: chunk c of rank s is virtual stage 2c + s (rank 0: v0, v2; rank 1: v1, v3). The k-th
 * forward micro-step is chunk (k / 2) % 2 of micro-batch (k / 4)·2 + k % 2, so k = 0..7 runs (mb.chunk)
 * 0.0 1.0 0.1 1.1 2.0 3.0 2.1 3.1; the k-th backward the chunk 1 - (k / 2) % 2: 0.1 1.1 0.0 1.0 2.1 3.1 2.0 3.0.
 * Warm-up: rank 0 2·1 + 1·2 = 4, rank 1 0 + 2 = 2 (both clamped to m·V = 8, or 4 when m = 2). Exchanges: v0 sends
 * its activation to rank 1 and takes its gradient from rank 1; v1 (rank 1 chunk 0) exchanges both ways with rank 0;
 * v2 (rank 0 chunk 1) too, with rank 1; v3 (rank 1 chunk 1, the last) receives activations from rank 0 and sends
 * gradients back to it. */
static void test_hand_worked(void) {
    /* p 1: what the trainer does today with micro-batches */
    check_hand_worked(1, 1, 3, 0, "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
    /* p 2 V 1 m 4: rank 0 warms up with 1 forward; rank 1 with none */
    check_hand_worked(2, 1, 4, 0,
                      "F0.0 sa0.0>1 F1.0 sa1.0>1 rg0.0<1 B0.0 F2.0 sa2.0>1 rg1.0<1 B1.0 F3.0 sa3.0>1 rg2.0<1 B2.0 "
                      "rg3.0<1 B3.0");
    check_hand_worked(2, 1, 4, 1,
                      "ra0.0<0 F0.0 B0.0 sg0.0>0 ra1.0<0 F1.0 B1.0 sg1.0>0 ra2.0<0 F2.0 B2.0 sg2.0>0 ra3.0<0 F3.0 "
                      "B3.0 sg3.0>0");
    /* p 4 V 1 m 4: rank 0 warms up with 3 forwards, one (F3, B0) pair, then B1 B2 B3; rank 1 with 2; rank 3 none */
    check_hand_worked(4, 1, 4, 0,
                      "F0.0 sa0.0>1 F1.0 sa1.0>1 F2.0 sa2.0>1 F3.0 sa3.0>1 rg0.0<1 B0.0 rg1.0<1 B1.0 rg2.0<1 B2.0 "
                      "rg3.0<1 B3.0");
    check_hand_worked(4, 1, 4, 1,
                      "ra0.0<0 F0.0 sa0.0>2 ra1.0<0 F1.0 sa1.0>2 ra2.0<0 F2.0 sa2.0>2 rg0.0<2 B0.0 sg0.0>0 "
                      "ra3.0<0 F3.0 sa3.0>2 rg1.0<2 B1.0 sg1.0>0 rg2.0<2 B2.0 sg2.0>0 rg3.0<2 B3.0 sg3.0>0");
    check_hand_worked(4, 1, 4, 3,
                      "ra0.0<2 F0.0 B0.0 sg0.0>2 ra1.0<2 F1.0 B1.0 sg1.0>2 ra2.0<2 F2.0 B2.0 sg2.0>2 ra3.0<2 F3.0 "
                      "B3.0 sg3.0>2");
    /* p 2 V 2 m 4. Rank 0: warm-up 0.0 1.0 0.1 1.1; then (F, B) pairs (2.0, 0.1) (3.0, 1.1) (2.1, 0.0) (3.1, 1.0),
     * each as its receives, F, B, its sends; cool-down 2.1 3.1 2.0 3.0. */
    check_hand_worked(2, 2, 4, 0,
                      "F0.0 sa0.0>1 F1.0 sa1.0>1 ra0.1<1 F0.1 sa0.1>1 ra1.1<1 F1.1 sa1.1>1 "
                      "rg0.1<1 F2.0 B0.1 sa2.0>1 sg0.1>1 rg1.1<1 F3.0 B1.1 sa3.0>1 sg1.1>1 "
                      "ra2.1<1 rg0.0<1 F2.1 B0.0 sa2.1>1 ra3.1<1 rg1.0<1 F3.1 B1.0 sa3.1>1 "
                      "rg2.1<1 B2.1 sg2.1>1 rg3.1<1 B3.1 sg3.1>1 rg2.0<1 B2.0 rg3.0<1 B3.0");
    /* Rank 1: warm-up 0.0 1.0; pairs (0.1, 0.1) (1.1, 1.1) (2.0, 0.0) (3.0, 1.0) (2.1, 2.1) (3.1, 3.1); cool-down
     * 2.0 3.0. */
    check_hand_worked(2, 2, 4, 1,
                      "ra0.0<0 F0.0 sa0.0>0 ra1.0<0 F1.0 sa1.0>0 ra0.1<0 F0.1 B0.1 sg0.1>0 ra1.1<0 F1.1 B1.1 sg1.1>0 "
                      "ra2.0<0 rg0.0<0 F2.0 B0.0 sa2.0>0 sg0.0>0 ra3.0<0 rg1.0<0 F3.0 B1.0 sa3.0>0 sg1.0>0 "
                      "ra2.1<0 F2.1 B2.1 sg2.1>0 ra3.1<0 F3.1 B3.1 sg3.1>0 rg2.0<0 B2.0 sg2.0>0 rg3.0<0 B3.0 sg3.0>0");
    /* p 2 V 2 m 2: rank 0's warm-up (4) is all m·V = 4 forwards, then the 4 backwards; rank 1: warm-up 0.0 1.0,
     * pairs (0.1, 0.1) (1.1, 1.1), cool-down 0.0 1.0. */
    check_hand_worked(2, 2, 2, 0,
                      "F0.0 sa0.0>1 F1.0 sa1.0>1 ra0.1<1 F0.1 sa0.1>1 ra1.1<1 F1.1 sa1.1>1 "
                      "rg0.1<1 B0.1 sg0.1>1 rg1.1<1 B1.1 sg1.1>1 rg0.0<1 B0.0 rg1.0<1 B1.0");
    check_hand_worked(2, 2, 2, 1,
                      "ra0.0<0 F0.0 sa0.0>0 ra1.0<0 F1.0 sa1.0>0 ra0.1<0 F0.1 B0.1 sg0.1>0 ra1.1<0 F1.1 B1.1 sg1.1>0 "
                      "rg0.0<0 B0.0 sg0.0>0 rg1.0<0 B1.0 sg1.0>0");
}

/* ---- one rank's list on its own ---- */

/* the stash formula of schedule.h, in (micro-batch, chunk) activations */
static int stash_formula(int p, int V, int m, int s) {
    const int w1 = V == 1 ? p - s : 2 * (p - s - 1) + (V - 1) * p + 1;
    return w1 < m * V ? w1 : m * V;
}

static int is_exchange(moe_pp_op op) { return op != MOE_PP_FORWARD && op != MOE_PP_BACKWARD; }

static void check_rank(const moe_pp_shape *shape, int s, const moe_pp_step *st, int n) {
    const int p = shape->stages, V = shape->virtual_stages, m = shape->micro_batches, last = p * V - 1;
    /* per op and (micro-batch, chunk): how many steps, and where the last one stands */
    const size_t keys = (size_t)MOE_PP_OP_COUNT * m * V;
    int *seen = calloc(keys, sizeof *seen), *at = malloc(keys * sizeof *at);
    if (!seen || !at) abort();
    int held = 0, most = 0;
    for (int i = 0; i < n; i++) {
        if (st[i].op < 0 || st[i].op >= MOE_PP_OP_COUNT || st[i].micro_batch < 0 || st[i].micro_batch >= m ||
            st[i].chunk < 0 || st[i].chunk >= V) {
            test_problem("rank %d step %d: op %s, micro-batch %d, chunk %d out of range", s, i, op_name(st[i].op),
                         st[i].micro_batch, st[i].chunk);
            continue;
        }
        if (is_exchange(st[i].op) ? st[i].peer < 0 || st[i].peer >= p : st[i].peer != -1)
            test_problem("rank %d step %d: peer %d", s, i, st[i].peer);
        const int key = (st[i].op * m + st[i].micro_batch) * V + st[i].chunk;
        seen[key]++, at[key] = i;
        held += (st[i].op == MOE_PP_FORWARD) - (st[i].op == MOE_PP_BACKWARD);
        if (held > most) most = held;
    }
    for (int mb = 0; mb < m; mb++)
        for (int c = 0; c < V; c++) {
            const int v = c * p + s;
#define SEEN(op) seen[((op) * m + mb) * V + c]
#define AT(op) at[((op) * m + mb) * V + c]
            if (SEEN(MOE_PP_FORWARD) != 1 || SEEN(MOE_PP_BACKWARD) != 1) {
                test_problem("rank %d: micro-batch %d chunk %d has %d forwards and %d backwards", s, mb, c,
                             SEEN(MOE_PP_FORWARD), SEEN(MOE_PP_BACKWARD));
                continue;
            }
            if (AT(MOE_PP_BACKWARD) < AT(MOE_PP_FORWARD))
                test_problem("rank %d: micro-batch %d chunk %d: backward (step %d) before forward (step %d)", s, mb, c,
                             AT(MOE_PP_BACKWARD), AT(MOE_PP_FORWARD));
            /* each exchange: whether it must be there, the compute it goes with, the virtual stage at the other end */
            const struct {
                moe_pp_op op, compute;
                int wanted, before, other;
            } ex[] = {
                {MOE_PP_RECV_ACTIVATION, MOE_PP_FORWARD, v > 0, 1, v - 1},
                {MOE_PP_SEND_ACTIVATION, MOE_PP_FORWARD, v < last, 0, v + 1},
                {MOE_PP_RECV_GRADIENT, MOE_PP_BACKWARD, v < last, 1, v + 1},
                {MOE_PP_SEND_GRADIENT, MOE_PP_BACKWARD, v > 0, 0, v - 1},
            };
            for (size_t e = 0; e < sizeof ex / sizeof ex[0]; e++) {
                if (SEEN(ex[e].op) != ex[e].wanted) {
                    test_problem("rank %d: micro-batch %d chunk %d (virtual stage %d): %d %s steps, want %d", s, mb, c,
                                 v, SEEN(ex[e].op), op_name(ex[e].op), ex[e].wanted);
                    continue;
                }
                if (!ex[e].wanted) continue;
                if ((AT(ex[e].op) < AT(ex[e].compute)) != ex[e].before)
                    test_problem(
                        "rank %d: micro-batch %d chunk %d: %s at step %d is on the wrong side of %s at step %d", s, mb,
                        c, op_name(ex[e].op), AT(ex[e].op), op_name(ex[e].compute), AT(ex[e].compute));
                if (st[AT(ex[e].op)].peer != ex[e].other % p) /* virtual stage u is on rank u % p */
                    test_problem("rank %d: micro-batch %d chunk %d: %s names peer %d; virtual stage %d is on rank %d",
                                 s, mb, c, op_name(ex[e].op), st[AT(ex[e].op)].peer, ex[e].other, ex[e].other % p);
            }
#undef SEEN
#undef AT
        }
    const int want = stash_formula(p, V, m, s), got = moe_pp_schedule_max_in_flight(st, n);
    if (most != want || got != want)
        test_problem(
            "rank %d: %d activations in flight at most (moe_pp_schedule_max_in_flight: %d); the formula says %d", s,
            most, got, want);
    free(seen), free(at);
}

/* ---- all ranks together: sends post and never block, a receive waits for its matching send ---- */

static void simulate(const moe_pp_shape *shape, moe_pp_step *const *steps, const int *count) {
    const int p = shape->stages, V = shape->virtual_stages, m = shape->micro_batches, stages = p * V;
    const size_t cells = (size_t)m * stages;
    /* per (micro-batch, virtual stage): the sender's rank + 1 of the activation (gradient) posted to it, whether it
     * was received, and when (a global clock from 1) its forward and backward ran */
    int *posted[2], *taken[2];
    long *forward_at = calloc(cells, sizeof *forward_at), *backward_at = calloc(cells, sizeof *backward_at);
    for (int k = 0; k < 2; k++) posted[k] = calloc(cells, sizeof(int)), taken[k] = calloc(cells, sizeof(int));
    if (!forward_at || !backward_at || !posted[0] || !posted[1] || !taken[0] || !taken[1]) abort();
    int pc[MAX_STAGES] = {0};
    long clock = 1;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < p; r++)
            for (; pc[r] < count[r]; pc[r]++, progress = 1) { /* each rank runs until a receive blocks it */
                const moe_pp_step *st = &steps[r][pc[r]];
                if (st->micro_batch < 0 || st->micro_batch >= m || st->chunk < 0 || st->chunk >= V) continue;
                const int mb = st->micro_batch, v = st->chunk * p + r;
                const size_t here = (size_t)mb * stages + v;
                const int grad = st->op == MOE_PP_RECV_GRADIENT || st->op == MOE_PP_SEND_GRADIENT;
                if (st->op == MOE_PP_RECV_ACTIVATION || st->op == MOE_PP_RECV_GRADIENT) {
                    if (!posted[grad][here]) break;
                    if (taken[grad][here]++)
                        test_problem("rank %d receives micro-batch %d's %s for virtual stage %d twice", r, mb,
                                     grad ? "gradient" : "activation", v);
                    if (posted[grad][here] - 1 != st->peer)
                        test_problem("rank %d receives micro-batch %d's %s for virtual stage %d from rank %d; rank %d "
                                     "sent it",
                                     r, mb, grad ? "gradient" : "activation", v, st->peer, posted[grad][here] - 1);
                } else if (st->op == MOE_PP_SEND_ACTIVATION || st->op == MOE_PP_SEND_GRADIENT) {
                    const int to = grad ? v - 1 : v + 1;
                    if (to < 0 || to >= stages) {
                        test_problem("rank %d sends micro-batch %d's %s from virtual stage %d, the end", r, mb,
                                     grad ? "gradient" : "activation", v);
                        continue;
                    }
                    if (posted[grad][(size_t)mb * stages + to]++)
                        test_problem("rank %d sends micro-batch %d's %s to virtual stage %d twice", r, mb,
                                     grad ? "gradient" : "activation", to);
                    posted[grad][(size_t)mb * stages + to] = r + 1;
                } else if (st->op == MOE_PP_FORWARD) {
                    if (v > 0 && !forward_at[here - 1])
                        test_problem("micro-batch %d's forward at virtual stage %d runs before the one at %d", mb, v,
                                     v - 1);
                    forward_at[here] = clock++;
                } else if (st->op == MOE_PP_BACKWARD) {
                    if (!forward_at[here])
                        test_problem("micro-batch %d's backward at virtual stage %d runs before its forward", mb, v);
                    if (v < stages - 1 && !backward_at[here + 1])
                        test_problem("micro-batch %d's backward at virtual stage %d runs before the one at %d", mb, v,
                                     v + 1);
                    backward_at[here] = clock++;
                }
            }
    }
    for (int r = 0; r < p; r++)
        if (pc[r] < count[r]) {
            char what[64];
            compact(&steps[r][pc[r]], 1, what, sizeof what);
            test_problem("deadlock: rank %d waits forever at step %d of %d (%s)", r, pc[r], count[r], what);
        }
    /* what never happened: counted, the first of each kind named */
    size_t unreceived = 0, unrun = 0, first_unreceived = 0, first_unrun = 0;
    for (size_t i = 0; i < cells; i++) {
        for (int k = 0; k < 2; k++)
            if (posted[k][i] && !taken[k][i] && !unreceived++) first_unreceived = i;
        if ((!forward_at[i] || !backward_at[i]) && !unrun++) first_unrun = i;
    }
    if (unreceived)
        test_problem("%zu sends never received, the first to micro-batch %zu's virtual stage %zu", unreceived,
                     first_unreceived / stages, first_unreceived % stages);
    if (unrun)
        test_problem("%zu (micro-batch, virtual stage) pairs lack a forward or backward, the first micro-batch %zu at "
                     "virtual stage %zu",
                     unrun, first_unrun / stages, first_unrun % stages);
    free(forward_at), free(backward_at);
    for (int k = 0; k < 2; k++) free(posted[k]), free(taken[k]);
}

/* ---- all ranks together on a transport that runs each rank's posts in order (NCCL), posted as the runtime posts
 * them (models/stage_runner.c, schedule.h "Posting in order"): each run of consecutive exchanges one batch, its
 * receive waited for before the compute; a slot's earlier send waited for before the slot's buffer is written
 * again (a forward rewrites its pass's output; a gradient's copy its pass's buffer); every send at the end. A batch
 * at the head of a rank's queue completes an exchange when the peer's matching post heads the peer's queue; the
 * queue moves on when the whole batch is done. Matching has no tags: the k-th send from a to b meets the k-th
 * receive b posts from a, which must be the message it was meant for. paired = 0 posts every exchange alone. ---- */

enum { MAX_OPS = 4096, MAX_SLOTS = 4 * 16 }; /* slots: V <= 4 chunks of at most m <= 16 passes */

typedef struct {
    int rank, peer, send, grad, mb, v; /* v: the virtual stage the message goes to */
    int batch, seq, done;              /* the rank's batch it was posted in, its place in its directed pair */
} sim_op;

typedef struct {
    sim_op ops[MAX_OPS];
    int num_ops;
    int posted[MAX_STAGES][MAX_STAGES][2]; /* [from][to][is a receive]: posts so far */
    int by_seq[MAX_STAGES][MAX_STAGES][2][MAX_OPS / 4];
    int head[MAX_STAGES]; /* the batch at the head of each rank's queue */
} in_order_sim;

/* Host actions: post a batch (ops op .. op + n), wait for op, or compute. */
typedef enum { SIM_POST, SIM_WAIT, SIM_COMPUTE } sim_action_kind;
typedef struct {
    sim_action_kind kind;
    int op, n;
} sim_action;

/* the runtime's stash slot of a step's (micro-batch, chunk) */
static int sim_slot(const moe_pp_step *st, int passes) { return st->chunk * passes + st->micro_batch % passes; }

static int sim_post(in_order_sim *sim, const moe_pp_shape *shape, int r, const moe_pp_step *st, int batch) {
    const int p = shape->stages, v = st->chunk * p + r;
    const int send = st->op == MOE_PP_SEND_ACTIVATION || st->op == MOE_PP_SEND_GRADIENT;
    const int grad = st->op == MOE_PP_SEND_GRADIENT || st->op == MOE_PP_RECV_GRADIENT;
    if (sim->num_ops == MAX_OPS) abort();
    const int id = sim->num_ops++, from = send ? r : st->peer, to = send ? st->peer : r;
    int *n = &sim->posted[from][to][!send];
    if (*n == MAX_OPS / 4) abort();
    sim->ops[id] = (sim_op){r, st->peer, send, grad, st->micro_batch, send ? (grad ? v - 1 : v + 1) : v, batch, *n, 0};
    sim->by_seq[from][to][!send][(*n)++] = id;
    return id;
}

/* The host's actions of rank r, as the runtime takes them. */
static int sim_actions(in_order_sim *sim, const moe_pp_shape *shape, int r, const moe_pp_step *st, int n,
                       int paired, sim_action *out) {
    const int V = shape->virtual_stages, passes = moe_pp_schedule_passes(st, n, V);
    int act_sent[MAX_SLOTS], grad_sent[MAX_SLOTS], count = 0, batch = 0;
    if (V * passes > (int)(sizeof act_sent / sizeof act_sent[0])) abort();
    for (int i = 0; i < V * passes; i++) act_sent[i] = grad_sent[i] = -1;
#define WAIT_FOR(x) \
    if ((x) >= 0) out[count++] = (sim_action){SIM_WAIT, (x), 0}, (x) = -1
    for (int i = 0; i < n; i++) {
        if (!is_exchange(st[i].op)) {
            if (st[i].op == MOE_PP_FORWARD) WAIT_FOR(act_sent[sim_slot(&st[i], passes)]);
            out[count++] = (sim_action){SIM_COMPUTE, -1, 0};
            continue;
        }
        const int end = paired ? moe_pp_exchange_run_end(st, n, i) : i + 1;
        for (int j = i; j < end; j++) {
            const int s = sim_slot(&st[j], passes);
            if (st[j].op == MOE_PP_SEND_ACTIVATION) WAIT_FOR(act_sent[s]);
            if (st[j].op == MOE_PP_SEND_GRADIENT) WAIT_FOR(grad_sent[s]);
        }
        const int first = sim->num_ops;
        for (int j = i; j < end; j++) {
            const int s = sim_slot(&st[j], passes), id = sim_post(sim, shape, r, &st[j], batch);
            if (st[j].op == MOE_PP_SEND_ACTIVATION) act_sent[s] = id;
            if (st[j].op == MOE_PP_SEND_GRADIENT) grad_sent[s] = id;
        }
        out[count++] = (sim_action){SIM_POST, first, end - i}, batch++;
        for (int j = i; j < end; j++)
            if (!sim->ops[first + j - i].send) out[count++] = (sim_action){SIM_WAIT, first + j - i, 0};
        i = end - 1;
    }
    for (int i = 0; i < V * passes; i++) {
        WAIT_FOR(act_sent[i]);
        WAIT_FOR(grad_sent[i]);
    }
#undef WAIT_FOR
    return count;
}

static void simulate_in_order(const moe_pp_shape *shape, moe_pp_step *const *steps, const int *count, int paired) {
    const int p = shape->stages;
    in_order_sim *sim = calloc(1, sizeof *sim);
    sim_action *actions[MAX_STAGES];
    int num_actions[MAX_STAGES], pc[MAX_STAGES] = {0}, queued[MAX_STAGES] = {0}, *queue[MAX_STAGES];
    if (!sim) abort();
    for (int r = 0; r < p; r++) {
        actions[r] = malloc((size_t)count[r] * 4 * sizeof(sim_action));
        queue[r] = malloc((size_t)count[r] * sizeof(int)); /* each batch's first op */
        if (!actions[r] || !queue[r]) abort();
        num_actions[r] = sim_actions(sim, shape, r, steps[r], count[r], paired, actions[r]);
    }
    /* every directed pair: as many receives as sends, each the message its send carries */
    for (int a = 0; a < p; a++)
        for (int b = 0; b < p; b++) {
            if (sim->posted[a][b][0] != sim->posted[a][b][1])
                test_problem("in order: rank %d sends %d messages to rank %d, which receives %d", a,
                             sim->posted[a][b][0], b, sim->posted[a][b][1]);
            for (int k = 0; k < sim->posted[a][b][0] && k < sim->posted[a][b][1]; k++) {
                const sim_op *s = &sim->ops[sim->by_seq[a][b][0][k]], *q = &sim->ops[sim->by_seq[a][b][1][k]];
                if (s->grad != q->grad || s->mb != q->mb || s->v != q->v)
                    test_problem("in order: rank %d's message %d to rank %d (micro-batch %d's %s for virtual stage %d) "
                                 "lands in the receive of micro-batch %d's %s for virtual stage %d",
                                 a, k, b, s->mb, s->grad ? "gradient" : "activation", s->v, q->mb,
                                 q->grad ? "gradient" : "activation", q->v);
            }
        }
    /* a rank's queue: the first op of each batch it posted, batch_size[first] ops from there */
    int *batch_size = calloc(sim->num_ops + 1, sizeof(int));
    if (!batch_size) abort();
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < p; r++) /* the host runs until a wait blocks it */
            for (; pc[r] < num_actions[r]; pc[r]++, progress = 1) {
                const sim_action *a = &actions[r][pc[r]];
                if (a->kind == SIM_WAIT && !sim->ops[a->op].done) break;
                if (a->kind == SIM_POST) queue[r][queued[r]++] = a->op, batch_size[a->op] = a->n;
            }
        for (int r = 0; r < p; r++) { /* the head batches complete what their peers' head batches match */
            if (sim->head[r] == queued[r]) continue;
            const int first = queue[r][sim->head[r]];
            int open = 0;
            for (int id = first; id < first + batch_size[first]; id++) {
                sim_op *o = &sim->ops[id];
                if (o->done) continue;
                const int from = o->send ? r : o->peer, to = o->send ? o->peer : r;
                const int other = o->seq < sim->posted[from][to][o->send] ? sim->by_seq[from][to][o->send][o->seq] : -1;
                const int peer_first = sim->head[o->peer] < queued[o->peer] ? queue[o->peer][sim->head[o->peer]] : -1;
                const int peer_head = peer_first >= 0 ? sim->ops[peer_first].batch : -1;
                if (other >= 0 && sim->ops[other].batch == peer_head)
                    o->done = sim->ops[other].done = 1, progress = 1;
                else
                    open++;
            }
            if (!open) sim->head[r]++, progress = 1;
        }
    }
    for (int r = 0; r < p; r++)
        if (pc[r] < num_actions[r] || sim->head[r] < queued[r]) {
            const sim_op *o = pc[r] < num_actions[r] ? &sim->ops[actions[r][pc[r]].op] : NULL;
            test_problem("in order: deadlock: rank %d waits forever%s%s (micro-batch %d's %s, peer %d)", r,
                         o ? " for a " : " on its queue", o ? (o->send ? "send" : "receive") : "", o ? o->mb : -1,
                         o ? (o->grad ? "gradient" : "activation") : "", o ? o->peer : -1);
        }
    for (int r = 0; r < p; r++) free(actions[r]), free(queue[r]);
    free(batch_size), free(sim);
}

/* ---- a whole pipeline's schedules ---- */

typedef struct {
    moe_pp_shape shape;
    moe_pp_step *steps[MAX_STAGES];
    int count[MAX_STAGES];
} pipeline;

static int pipeline_build(pipeline *pl, int p, int V, int m) {
    memset(pl, 0, sizeof *pl);
    pl->shape = (moe_pp_shape){p, V, m};
    for (int s = 0; s < p; s++) {
        const moe_status status = moe_pp_schedule(&pl->shape, s, &pl->steps[s], &pl->count[s]);
        CHECK(status == MOE_OK, "p %d V %d m %d rank %d: %s", p, V, m, s, moe_failure_message(status));
        if (status != MOE_OK) return 0;
    }
    return 1;
}

static void pipeline_free(pipeline *pl) {
    for (int s = 0; s < pl->shape.stages; s++) free(pl->steps[s]);
}

/* the problems the checks find in the pipeline's schedules */
static int pipeline_problems(const pipeline *pl) {
    test_problems = 0;
    for (int s = 0; s < pl->shape.stages; s++) check_rank(&pl->shape, s, pl->steps[s], pl->count[s]);
    simulate(&pl->shape, pl->steps, pl->count);
    if (pl->shape.stages > 1 || pl->shape.virtual_stages == 1) /* one rank's chunks sending to itself: not run so */
        simulate_in_order(&pl->shape, pl->steps, pl->count, 1);
    return test_problems;
}

static void test_properties(void) {
    const int ps[] = {1, 2, 4, 8}, Vs[] = {1, 2, 4};
    int shapes = 0, refused = 0;
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        for (size_t j = 0; j < sizeof Vs / sizeof Vs[0]; j++)
            for (int m = 1; m <= 16; m++) {
                const int p = ps[i], V = Vs[j];
                if (V >= 2 && m % p) { /* refused (the messages: test_refusals) */
                    const moe_status status = moe_pp_shape_check(&(moe_pp_shape){p, V, m});
                    CHECK(status == MOE_ERR_INVALID_CONFIG, "p %d V %d m %d: accepted", p, V, m);
                    refused++;
                    continue;
                }
                pipeline pl;
                if (!pipeline_build(&pl, p, V, m)) continue;
                const int found = pipeline_problems(&pl);
                CHECK(found == 0, "p %d V %d m %d: %d problems (above)", p, V, m, found);
                pipeline_free(&pl), shapes++;
            }
    printf("properties hold for %d shapes; %d interleaved shapes with m not a multiple of p refused\n", shapes,
           refused);
}

static void check_refused(const moe_pp_shape *shape, int stage, moe_status want, const char *message) {
    moe_pp_step *steps = (moe_pp_step *)&steps; /* not NULL: a refusal must set it */
    int n = -1;
    moe_failure_clear();
    const moe_status status = moe_pp_schedule(shape, stage, &steps, &n);
    const char *got = moe_failure_message(status);
    CHECK(status == want && strstr(got, message) && !steps && n == 0,
          "p %d V %d m %d rank %d: status %s, message \"%s\" (want %s, containing \"%s\")", shape ? shape->stages : 0,
          shape ? shape->virtual_stages : 0, shape ? shape->micro_batches : 0, stage, moe_status_string(status), got,
          moe_status_string(want), message);
    if (status == MOE_OK) free(steps);
    printf("refused: %s\n", got);
}

static void test_refusals(void) {
    check_refused(&(moe_pp_shape){2, 2, 3}, 0, MOE_ERR_INVALID_CONFIG,
                  "interleaved pipeline schedule (2 virtual stages per rank): 3 micro-batches is not a multiple of the "
                  "2 pipeline stages");
    check_refused(&(moe_pp_shape){4, 4, 6}, 3, MOE_ERR_INVALID_CONFIG, "use a multiple of 4, or 1 virtual stage");
    check_refused(&(moe_pp_shape){0, 1, 4}, 0, MOE_ERR_INVALID_CONFIG, "0 pipeline stages; want 1 or more");
    check_refused(&(moe_pp_shape){2, 0, 4}, 0, MOE_ERR_INVALID_CONFIG, "0 virtual stages per rank; want 1 or more");
    check_refused(&(moe_pp_shape){2, 1, -1}, 0, MOE_ERR_INVALID_CONFIG, "-1 micro-batches; want 1 or more");
    check_refused(&(moe_pp_shape){2, 1, 4}, 2, MOE_ERR_INVALID_CONFIG, "stage 2 is outside 0 .. 1");
    check_refused(&(moe_pp_shape){2, 1, 4}, -1, MOE_ERR_INVALID_CONFIG, "stage -1 is outside 0 .. 1");
    check_refused(&(moe_pp_shape){2, 4, 1 << 28}, 0, MOE_ERR_INVALID_CONFIG, "too many steps");
    check_refused(NULL, 0, MOE_ERR_INVALID_ARG, "no shape");
    /* 1F1B takes any m, fewer micro-batches than stages included */
    CHECK_OK(moe_pp_shape_check(&(moe_pp_shape){8, 1, 3}));
}

static void test_print(void) {
    const moe_pp_shape shape = {2, 2, 2};
    moe_pp_step *steps = NULL;
    int n = 0;
    CHECK_OK(moe_pp_schedule(&shape, 1, &steps, &n));
    FILE *f = tmpfile();
    if (!f || n < 10) abort();
    moe_pp_schedule_print(f, steps, 10);
    char got[512] = {0};
    rewind(f);
    const size_t len = fread(got, 1, sizeof got - 1, f);
    got[len] = 0;
    fclose(f);
    const char *want = "recv act mb 0 chunk 0 <- 0\nF mb 0 chunk 0\nsend act mb 0 chunk 0 -> 0\n"
                       "recv act mb 1 chunk 0 <- 0\nF mb 1 chunk 0\nsend act mb 1 chunk 0 -> 0\n"
                       "recv act mb 0 chunk 1 <- 0\nF mb 0 chunk 1\nB mb 0 chunk 1\nsend grad mb 0 chunk 1 -> 0\n";
    CHECK(!strcmp(got, want), "printed:\n%s\nwant:\n%s", got, want);
    CHECK(moe_pp_virtual_stage(&shape, 1, 1) == 3, "rank 1's chunk 1 is virtual stage 3");
    free(steps);
}

/* ---- schedules broken on purpose: the checks must find each ---- */

static void swap(moe_pp_step *st, int i, int j) {
    const moe_pp_step t = st[i];
    st[i] = st[j], st[j] = t;
}

static void expect_caught(const char *what, pipeline *pl) {
    printf("broken on purpose: %s\n", what);
    test_expecting_problems = 1;
    const int found = pipeline_problems(pl);
    test_expecting_problems = 0;
    CHECK(found > 0, "%s: not caught", what);
    pipeline_free(pl);
}

static void test_broken_schedules(void) {
    pipeline pl;
    /* p 2 V 1 m 4 rank 1: "ra0.0<0 F0.0 B0.0 ..." */
    if (pipeline_build(&pl, 2, 1, 4)) {
        swap(pl.steps[1], 1, 2);
        expect_caught("p 2 V 1 m 4, rank 1 runs B0 before F0", &pl);
    }
    /* p 2 V 1 m 2 rank 0: "F0.0 sa0.0>1 F1.0 sa1.0>1 rg0.0<1 ...": waiting for mb 0's gradient before sending its
     * activation (each rank's list still looks right on its own) */
    if (pipeline_build(&pl, 2, 1, 2)) {
        swap(pl.steps[0], 1, 4);
        expect_caught("p 2 V 1 m 2, rank 0 waits for mb 0's gradient before it sends mb 0's activation", &pl);
    }
    /* p 2 V 2 m 2 rank 0: waits for mb 0's gradient at chunk 0 (which needs its own chunk 1's backward) before
     * chunk 1's forward of mb 0: "... ra0.1<1 F0.1 sa0.1>1 ..." at 4..6, "rg0.0<1 B0.0" at 16..17 */
    if (pipeline_build(&pl, 2, 2, 2)) {
        moe_pp_step *st = pl.steps[0];
        swap(st, 4, 16), swap(st, 5, 17);
        expect_caught("p 2 V 2 m 2, rank 0 runs chunk 0's backward of mb 0 before chunk 1's forward of it", &pl);
    }
    /* p 4 V 1 m 4 rank 1: its first receive names rank 2 instead of rank 0 */
    if (pipeline_build(&pl, 4, 1, 4)) {
        pl.steps[1][0].peer = 2;
        expect_caught("p 4 V 1 m 4, rank 1 receives mb 0's activation from rank 2", &pl);
    }
    /* on an in-order transport (NCCL): each exchange posted alone deadlocks 1F1B (why the runtime pairs them), and
     * rank 0 sending mb 1's activation before mb 0's lands each in the other's receive */
    if (pipeline_build(&pl, 2, 1, 2)) {
        for (int broken = 0; broken < 2; broken++) {
            printf("broken on purpose: p 2 V 1 m 2 on an in-order transport, %s\n",
                   broken ? "rank 0's sends of mb 0 and 1 swapped" : "every exchange posted alone");
            if (broken) swap(pl.steps[0], 1, 3);
            test_expecting_problems = 1, test_problems = 0;
            simulate_in_order(&pl.shape, pl.steps, pl.count, broken);
            test_expecting_problems = 0;
            CHECK(test_problems > 0, "p 2 V 1 m 2 in order, case %d: not caught", broken);
        }
        pipeline_free(&pl);
    }
    /* p 2 V 1 m 4 rank 1 as GPipe (all forwards, then all backwards): valid, but a stash of 4, not 1 */
    if (pipeline_build(&pl, 2, 1, 4)) {
        moe_pp_step *st = pl.steps[1], gpipe[16];
        int n = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < pl.count[1]; i++)
                if ((st[i].op == MOE_PP_RECV_ACTIVATION || st[i].op == MOE_PP_FORWARD) == !pass) gpipe[n++] = st[i];
        memcpy(st, gpipe, sizeof gpipe);
        expect_caught("p 2 V 1 m 4, rank 1 runs GPipe's order", &pl);
    }
    /* p 2 V 2 m 4 rank 1 drops its first send (mb 0's activation from virtual stage 1) */
    if (pipeline_build(&pl, 2, 2, 4)) {
        memmove(&pl.steps[1][2], &pl.steps[1][3], (pl.count[1] - 3) * sizeof(moe_pp_step));
        pl.count[1]--;
        expect_caught("p 2 V 2 m 4, rank 1 never sends mb 0's activation on", &pl);
    }
    /* p 4 V 2 m 4 rank 3: forwards of a chunk in the wrong chunk: chunk 1's first forward labelled chunk 0 */
    if (pipeline_build(&pl, 4, 2, 4)) {
        for (int i = 0; i < pl.count[3]; i++)
            if (pl.steps[3][i].op == MOE_PP_FORWARD && pl.steps[3][i].chunk == 1) {
                pl.steps[3][i].chunk = 0;
                break;
            }
        expect_caught("p 4 V 2 m 4, rank 3 runs a chunk 1 forward as chunk 0", &pl);
    }
}

int main(void) {
    test_hand_worked();
    test_properties();
    test_refusals();
    test_print();
    test_broken_schedules();
    return test_finish("test_pp_schedule");
}
