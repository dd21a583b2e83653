/* schedule.c — one pipeline rank's 1F1B or interleaved 1F1B steps (schedule.h has the formulas). */
#include "pipeline/schedule.h"

#include <limits.h>
#include <stdlib.h>

#include "core/fail.h"

/* the most steps one micro-step adds: a receive, the compute, a send */
enum { STEPS_PER_MICRO_STEP = 3 };

moe_status moe_pp_shape_check(const moe_pp_shape *shape) {
    if (!shape) return moe_fail(MOE_ERR_INVALID_ARG, "pipeline schedule: no shape");
    const int p = shape->stages, V = shape->virtual_stages, m = shape->micro_batches;
    if (p < 1) return moe_fail(MOE_ERR_INVALID_CONFIG, "pipeline schedule: %d pipeline stages; want 1 or more", p);
    if (V < 1)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "pipeline schedule: %d virtual stages per rank; want 1 or more", V);
    if (m < 1) return moe_fail(MOE_ERR_INVALID_CONFIG, "pipeline schedule: %d micro-batches; want 1 or more", m);
    /* p·V virtual stages, and 2·m·V micro-steps of up to 3 steps each, must fit an int */
    if (p > INT_MAX / V || m > INT_MAX / (2 * STEPS_PER_MICRO_STEP) / V)
        return moe_fail(MOE_ERR_INVALID_CONFIG,
                        "pipeline schedule: %d stages, %d virtual stages, %d micro-batches: too many steps to count",
                        p, V, m);
    if (V >= 2 && m % p != 0)
        return moe_fail(MOE_ERR_INVALID_CONFIG,
                        "interleaved pipeline schedule (%d virtual stages per rank): %d micro-batches is not a "
                        "multiple of the %d pipeline stages (the micro-batches pass each chunk in groups of %d, as in "
                        "Megatron-LM); use a multiple of %d, or 1 virtual stage",
                        V, m, p, p, p);
    return MOE_OK;
}

int moe_pp_virtual_stage(const moe_pp_shape *shape, int stage, int chunk) { return chunk * shape->stages + stage; }

/* forwards before the first backward, unclamped (schedule.h) */
static long long warmup_unclamped(const moe_pp_shape *shape, int stage) {
    const long long p = shape->stages, V = shape->virtual_stages;
    return V == 1 ? p - stage - 1 : 2 * (p - stage - 1) + (V - 1) * p;
}

typedef struct {
    const moe_pp_shape *shape;
    int stage;
    moe_pp_step *steps;
    int count;
} builder;

static void add(builder *b, moe_pp_op op, int micro_batch, int chunk, int peer) {
    b->steps[b->count++] = (moe_pp_step){op, micro_batch, chunk, peer};
}

/* Parts of the k-th forward or backward micro-step: groups of p micro-batches pass the chunks in turn, forwards in
 * chunk order 0 .. V - 1, backwards in reverse (with V = 1: micro-batch k, chunk 0). */
enum { RECEIVE = 1, COMPUTE = 2, SEND = 4, WHOLE = RECEIVE | COMPUTE | SEND };

static void add_micro_step(builder *b, int k, int forward, int parts) {
    const int p = b->shape->stages, V = b->shape->virtual_stages, last = p * V - 1;
    const int micro_batch = k / (p * V) * p + k % p;
    const int turn = k / p % V, chunk = forward ? turn : V - 1 - turn;
    const int v = moe_pp_virtual_stage(b->shape, b->stage, chunk);
    const int prev = (b->stage + p - 1) % p, next = (b->stage + 1) % p;
    if (forward) {
        if (parts & RECEIVE && v > 0) add(b, MOE_PP_RECV_ACTIVATION, micro_batch, chunk, prev);
        if (parts & COMPUTE) add(b, MOE_PP_FORWARD, micro_batch, chunk, -1);
        if (parts & SEND && v < last) add(b, MOE_PP_SEND_ACTIVATION, micro_batch, chunk, next);
    } else {
        if (parts & RECEIVE && v < last) add(b, MOE_PP_RECV_GRADIENT, micro_batch, chunk, next);
        if (parts & COMPUTE) add(b, MOE_PP_BACKWARD, micro_batch, chunk, -1);
        if (parts & SEND && v > 0) add(b, MOE_PP_SEND_GRADIENT, micro_batch, chunk, prev);
    }
}

/* A steady-state pair, forward f then backward k. 1F1B: each micro-step whole. Interleaved: both receives, both
 * computes, both sends (Megatron-LM's send_forward_backward_recv_forward_backward: on a transport that runs posts in
 * order, the sends of one pair and the receives of the next go as one batch, which the interleaved schedule needs
 * to be free of deadlock there). */
static void add_pair(builder *b, int f, int k) {
    if (b->shape->virtual_stages == 1) {
        add_micro_step(b, f, 1, WHOLE), add_micro_step(b, k, 0, WHOLE);
        return;
    }
    for (int part = RECEIVE; part <= SEND; part <<= 1) add_micro_step(b, f, 1, part), add_micro_step(b, k, 0, part);
}

moe_status moe_pp_schedule(const moe_pp_shape *shape, int stage, moe_pp_step **steps, int *count) {
    if (!steps || !count) return moe_fail(MOE_ERR_INVALID_ARG, "pipeline schedule: no place for the steps");
    *steps = NULL, *count = 0;
    MOE_TRY(moe_pp_shape_check(shape));
    if (stage < 0 || stage >= shape->stages)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "pipeline schedule: stage %d is outside 0 .. %d", stage,
                        shape->stages - 1);
    const int micro_steps = shape->micro_batches * shape->virtual_stages;
    const long long w = warmup_unclamped(shape, stage);
    const int warmup = w < micro_steps ? (int)w : micro_steps, steady = micro_steps - warmup;
    builder b = {shape, stage, malloc((size_t)micro_steps * 2 * STEPS_PER_MICRO_STEP * sizeof(moe_pp_step)), 0};
    if (!b.steps)
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "pipeline schedule: no memory for %d micro-steps", 2 * micro_steps);
    for (int k = 0; k < warmup; k++) add_micro_step(&b, k, 1, WHOLE);
    for (int k = 0; k < steady; k++) add_pair(&b, k + warmup, k);
    for (int k = steady; k < micro_steps; k++) add_micro_step(&b, k, 0, WHOLE);
    *steps = b.steps, *count = b.count;
    return MOE_OK;
}

int moe_pp_schedule_max_in_flight(const moe_pp_step *steps, int count) {
    int held = 0, most = 0;
    for (int i = 0; i < count; i++) {
        held += (steps[i].op == MOE_PP_FORWARD) - (steps[i].op == MOE_PP_BACKWARD);
        if (held > most) most = held;
    }
    return most;
}

int moe_pp_schedule_passes(const moe_pp_step *steps, int count, int chunks) {
    int most = 1;
    for (int c = 0; c < chunks; c++) {
        int held = 0;
        for (int i = 0; i < count; i++)
            if (steps[i].chunk == c) {
                held += (steps[i].op == MOE_PP_FORWARD) - (steps[i].op == MOE_PP_BACKWARD);
                if (held > most) most = held;
            }
    }
    return most;
}

int moe_pp_step_exchanges(const moe_pp_step *step) {
    return step->op != MOE_PP_FORWARD && step->op != MOE_PP_BACKWARD;
}

int moe_pp_exchange_run_end(const moe_pp_step *steps, int count, int i) {
    while (i < count && moe_pp_step_exchanges(&steps[i])) i++;
    return i;
}

static const char *const op_names[] = {
#define MOE__PP_OP_NAME(name, text, arrow) [name] = text,
    MOE_PP_OP_LIST(MOE__PP_OP_NAME)
#undef MOE__PP_OP_NAME
};
static const char *const op_arrows[] = {
#define MOE__PP_OP_ARROW(name, text, arrow) [name] = arrow,
    MOE_PP_OP_LIST(MOE__PP_OP_ARROW)
#undef MOE__PP_OP_ARROW
};

void moe_pp_schedule_print(FILE *f, const moe_pp_step *steps, int count) {
    for (int i = 0; i < count; i++) {
        const moe_pp_step *st = &steps[i];
        const int known = st->op >= 0 && st->op < MOE_PP_OP_COUNT;
        fprintf(f, "%s mb %d chunk %d", known ? op_names[st->op] : "?", st->micro_batch, st->chunk);
        if (known && op_arrows[st->op][0]) fprintf(f, " %s %d", op_arrows[st->op], st->peer);
        fputc('\n', f);
    }
}
