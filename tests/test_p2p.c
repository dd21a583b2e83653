/* test_p2p.c — the point-to-point driver (test_p2p.h). */
#include "tests/test_p2p.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_transport.h" /* white box: the count of completed exchanges */
#include "pipeline/schedule.h"
#include "tests/test_util.h"

enum { MESSAGES = 9, GUARD_NBYTES = 32, TAG_COUNT = 65, DIRECTIONS = 2 };

/* message m's size: zeros, odd sizes, and one past the eager limit of MPI's shared-memory transport */
static const size_t kNbytes[MESSAGES] = {0, 1, 7, 4096, 300 * 1024, 0, 33, 65536, 3};

static void *host_alloc(void *ctx, size_t nbytes) {
    (void)ctx;
    void *p = malloc(nbytes);
    if (!p) abort();
    memset(p, 0xFF, nbytes);
    return p;
}
static void host_copy(void *ctx, void *dst, const void *src, size_t nbytes) {
    (void)ctx;
    memcpy(dst, src, nbytes);
}
static void host_release(void *ctx, void *buf) {
    (void)ctx;
    free(buf);
}
const test_p2p_memory test_p2p_host = {host_alloc, host_copy, host_copy, host_release, NULL};

static uint8_t payload_byte(int src, int dst, int m, int dir, size_t j) {
    return (uint8_t)(src * 37 + dst * 11 + m * 5 + dir * 101 + j * 13 + (j >> 8) * 7);
}

static void fill(uint8_t *host, int src, int dst, int m, int dir, size_t nbytes) {
    for (size_t j = 0; j < nbytes; j++) host[j] = payload_byte(src, dst, m, dir, j);
}

/* direction 0 goes to the right (rank + 1), direction 1 to the left; the tag repeats every 3 messages */
static int ring_tag(int m, int dir) { return 2 * (m % 3) + dir; }

typedef struct {
    moe_comm *c;
    const test_p2p_memory *mem;
    const char *name;
    void *send[MESSAGES][DIRECTIONS], *recv[MESSAGES][DIRECTIONS];
    moe_comm_request *send_req[MESSAGES][DIRECTIONS], *recv_req[MESSAGES][DIRECTIONS];
} ring;

static void ring_alloc(ring *r) {
    const int me = moe_comm_rank(r->c), W = moe_comm_size(r->c);
    uint8_t *host = malloc(kNbytes[4] + GUARD_NBYTES);
    for (int m = 0; m < MESSAGES; m++)
        for (int dir = 0; dir < DIRECTIONS; dir++) {
            const int to = dir == 0 ? (me + 1) % W : (me + W - 1) % W;
            /* the first empty message goes with NULL buffers: allowed for 0 bytes */
            const int null_buf = kNbytes[m] == 0 && m == 0;
            r->send[m][dir] = null_buf ? NULL : r->mem->alloc(r->mem->ctx, kNbytes[m] + 1);
            r->recv[m][dir] = null_buf ? NULL : r->mem->alloc(r->mem->ctx, kNbytes[m] + GUARD_NBYTES);
            fill(host, me, to, m, dir, kNbytes[m]);
            if (kNbytes[m]) r->mem->write(r->mem->ctx, r->send[m][dir], host, kNbytes[m]);
        }
    free(host);
}

static void post_sends(ring *r) {
    const int me = moe_comm_rank(r->c), W = moe_comm_size(r->c);
    for (int m = 0; m < MESSAGES; m++)
        for (int dir = 0; dir < DIRECTIONS; dir++)
            CHECK_OK(moe_comm_isend_bytes(r->c, r->send[m][dir], kNbytes[m], dir == 0 ? (me + 1) % W : (me + W - 1) % W,
                                          ring_tag(m, dir), &r->send_req[m][dir]));
}

/* a message in direction dir comes from the other side: the left neighbour for direction 0 */
static void post_recvs(ring *r) {
    const int me = moe_comm_rank(r->c), W = moe_comm_size(r->c);
    for (int m = 0; m < MESSAGES; m++)
        for (int dir = 0; dir < DIRECTIONS; dir++)
            CHECK_OK(moe_comm_irecv_bytes(r->c, r->recv[m][dir], kNbytes[m], dir == 0 ? (me + W - 1) % W : (me + 1) % W,
                                          ring_tag(m, dir), &r->recv_req[m][dir]));
}

/* receives in reverse posting order, each checked at once (its data is complete after its own wait), then the
 * sends through wait_all; every wait is one exchange */
static void wait_and_check(ring *r) {
    const int me = moe_comm_rank(r->c), W = moe_comm_size(r->c);
    uint8_t *got = malloc(kNbytes[4] + GUARD_NBYTES), *want = malloc(kNbytes[4]);
    for (int m = MESSAGES - 1; m >= 0; m--)
        for (int dir = DIRECTIONS - 1; dir >= 0; dir--) {
            const long before = r->c->completed;
            CHECK_OK(moe_comm_wait(r->c, r->recv_req[m][dir]));
            CHECK(r->c->completed == before + 1, "%s: a wait completed %ld exchanges", r->name,
                  r->c->completed - before);
            if (!r->recv[m][dir]) continue;
            const int from = dir == 0 ? (me + W - 1) % W : (me + 1) % W;
            r->mem->read(r->mem->ctx, got, r->recv[m][dir], kNbytes[m] + GUARD_NBYTES);
            fill(want, from, me, m, dir, kNbytes[m]);
            size_t bad = 0, first = 0;
            for (size_t j = 0; j < kNbytes[m]; j++)
                if (got[j] != want[j] && bad++ == 0) first = j;
            CHECK(bad == 0, "%s rank %d: message %d (%zu bytes, direction %d, tag %d) from rank %d: %zu bytes wrong, "
                  "first at %zu", r->name, me, m, kNbytes[m], dir, ring_tag(m, dir), from, bad, first);
            int guard_ok = 1;
            for (size_t j = kNbytes[m]; j < kNbytes[m] + GUARD_NBYTES; j++) guard_ok &= got[j] == 0xFF;
            CHECK(guard_ok, "%s rank %d: message %d wrote past its %zu bytes", r->name, me, m, kNbytes[m]);
        }
    CHECK_OK(moe_comm_wait_all(r->c, &r->send_req[0][0], MESSAGES * DIRECTIONS));
    for (int m = 0; m < MESSAGES; m++)
        for (int dir = 0; dir < DIRECTIONS; dir++) {
            CHECK(!r->send_req[m][dir], "%s: wait_all left request %d %d", r->name, m, dir);
            if (r->send[m][dir]) r->mem->release(r->mem->ctx, r->send[m][dir]);
            if (r->recv[m][dir]) r->mem->release(r->mem->ctx, r->recv[m][dir]);
        }
    free(got), free(want);
}

static void check_ring(moe_comm *c, const test_p2p_memory *mem, const char *name, int batched) {
    ring r = {.c = c, .mem = mem, .name = name};
    ring_alloc(&r);
    if (batched) {
        CHECK_OK(moe_comm_batch_begin(c));
        post_recvs(&r);
        post_sends(&r);
        CHECK_OK(moe_comm_batch_end(c));
    } else {
        post_sends(&r);
        post_recvs(&r);
    }
    wait_and_check(&r);
}

/* TAG_COUNT 8-byte messages to the right, tag t * 500 (the last MOE_COMM_MAX_TAG), received in reverse tag order */
static void check_tags(moe_comm *c, const test_p2p_memory *mem, const char *name) {
    const int me = moe_comm_rank(c), W = moe_comm_size(c), right = (me + 1) % W, left = (me + W - 1) % W;
    moe_comm_request *sends[TAG_COUNT], *recvs[TAG_COUNT];
    void *send[TAG_COUNT], *recv[TAG_COUNT];
    for (int t = TAG_COUNT - 1; t >= 0; t--) {
        const int tag = t == TAG_COUNT - 1 ? MOE_COMM_MAX_TAG : t * 500;
        recv[t] = mem->alloc(mem->ctx, 8);
        CHECK_OK(moe_comm_irecv_bytes(c, recv[t], 8, left, tag, &recvs[t]));
    }
    for (int t = 0; t < TAG_COUNT; t++) {
        const int tag = t == TAG_COUNT - 1 ? MOE_COMM_MAX_TAG : t * 500;
        uint8_t host[8];
        fill(host, me, right, tag, 0, 8);
        send[t] = mem->alloc(mem->ctx, 8);
        mem->write(mem->ctx, send[t], host, 8);
        CHECK_OK(moe_comm_isend_bytes(c, send[t], 8, right, tag, &sends[t]));
    }
    CHECK_OK(moe_comm_wait_all(c, sends, TAG_COUNT));
    CHECK_OK(moe_comm_wait_all(c, recvs, TAG_COUNT));
    int bad = 0;
    for (int t = 0; t < TAG_COUNT; t++) {
        const int tag = t == TAG_COUNT - 1 ? MOE_COMM_MAX_TAG : t * 500;
        uint8_t got[8], want[8];
        mem->read(mem->ctx, got, recv[t], 8);
        fill(want, left, me, tag, 0, 8);
        bad += memcmp(got, want, 8) != 0;
        mem->release(mem->ctx, send[t]), mem->release(mem->ctx, recv[t]);
    }
    CHECK(bad == 0, "%s rank %d: %d of %d tagged messages got another tag's bytes", name, me, bad, TAG_COUNT);
}

static void check_refusals(moe_comm *c, const char *name) {
    const int W = moe_comm_size(c);
    char byte = 0;
    moe_comm_request *req = (moe_comm_request *)&byte; /* must come back NULL */
    CHECK(moe_comm_isend_bytes(c, &byte, 1, W, 0, &req) == MOE_ERR_INVALID_ARG && !req, "%s: peer %d accepted", name,
          W);
    CHECK(moe_comm_irecv_bytes(c, &byte, 1, -1, 0, &req) == MOE_ERR_INVALID_ARG, "%s: peer -1 accepted", name);
    CHECK(moe_comm_isend_bytes(c, &byte, 1, 0, -1, &req) == MOE_ERR_INVALID_ARG, "%s: tag -1 accepted", name);
    CHECK(moe_comm_irecv_bytes(c, &byte, 1, 0, MOE_COMM_MAX_TAG + 1, &req) == MOE_ERR_INVALID_ARG,
          "%s: tag MOE_COMM_MAX_TAG + 1 accepted", name);
    CHECK(moe_comm_isend_bytes(c, &byte, 1, 0, 0, NULL) == MOE_ERR_INVALID_ARG, "%s: NULL req accepted", name);
    CHECK(moe_comm_irecv_bytes(c, NULL, 1, 0, 0, &req) == MOE_ERR_INVALID_ARG, "%s: NULL buffer accepted", name);
    CHECK(moe_comm_wait(c, NULL) == MOE_ERR_INVALID_ARG, "%s: a wait for NULL accepted", name);
    CHECK(moe_comm_batch_end(c) == MOE_ERR_INVALID_ARG, "%s: a batch end without a begin accepted", name);
    /* inside a batch: no nesting, no wait (a refused wait leaves its request posted) */
    moe_comm_request *pair[2] = {NULL, NULL};
    const int me = moe_comm_rank(c);
    CHECK_OK(moe_comm_batch_begin(c));
    CHECK(moe_comm_batch_begin(c) == MOE_ERR_INVALID_ARG, "%s: a nested batch accepted", name);
    CHECK_OK(moe_comm_irecv_bytes(c, NULL, 0, me, 1, &pair[0]));
    CHECK_OK(moe_comm_isend_bytes(c, NULL, 0, me, 1, &pair[1]));
    CHECK(moe_comm_wait(c, pair[0]) == MOE_ERR_INVALID_ARG, "%s: a wait inside a batch accepted", name);
    CHECK_OK(moe_comm_batch_end(c));
    CHECK_OK(moe_comm_wait_all(c, pair, 2));
}

/* moe_comm_allgather_payload of sizes 0 to 300 KiB: every rank's bytes in rank order, the guard after them poisoned,
 * one exchange per peer and direction */
static void check_allgather(moe_comm *c, const test_p2p_memory *mem, const char *name) {
    const int W = moe_comm_size(c), me = moe_comm_rank(c);
    for (int m = 0; m < MESSAGES; m++) {
        const size_t n = kNbytes[m], total = n * (size_t)W + GUARD_NBYTES;
        uint8_t *host = malloc(total + 1), *want = malloc(total + 1);
        void *send = mem->alloc(mem->ctx, n + 1), *recv = mem->alloc(mem->ctx, total + 1);
        if (!host || !want) abort();
        fill(host, me, me, m, 0, n);
        mem->write(mem->ctx, send, host, n);
        for (int p = 0; p < W; p++) fill(want + (size_t)p * n, p, p, m, 0, n);
        memset(want + (size_t)W * n, 0xFF, GUARD_NBYTES);
        const long before = c->completed;
        CHECK_OK(moe_comm_allgather_payload(c, send, n, recv));
        mem->read(mem->ctx, host, recv, total);
        CHECK(!memcmp(host, want, total), "%s: the all-gather of %zu bytes per rank is not every rank's in order (or "
              "wrote past them)", name, n);
        CHECK(c->completed - before == 2L * (W - 1), "%s: the all-gather of %zu bytes completed %ld exchanges, not %d",
              name, n, c->completed - before, 2 * (W - 1));
        mem->release(mem->ctx, send), mem->release(mem->ctx, recv);
        free(host), free(want);
    }
}

void test_p2p_check(moe_comm *c, const test_p2p_memory *mem, const char *name, int tags_carried) {
    check_refusals(c, name);
    check_ring(c, mem, name, 1);
    check_allgather(c, mem, name);
    if (tags_carried) {
        check_ring(c, mem, name, 0);
        check_tags(c, mem, name);
    }
}

/* ---- the pipeline's schedules ---- */

enum { STAGE_MESSAGE_NBYTES = 64 * 1024 };

static int is_exchange(moe_pp_op op) { return op != MOE_PP_FORWARD && op != MOE_PP_BACKWARD; }
static int is_send(moe_pp_op op) { return op == MOE_PP_SEND_ACTIVATION || op == MOE_PP_SEND_GRADIENT; }
static int is_activation(moe_pp_op op) { return op == MOE_PP_SEND_ACTIVATION || op == MOE_PP_RECV_ACTIVATION; }

/* what names a message: its kind, micro-batch and the virtual stage it goes to */
static int message_id(int activation, int micro_batch, int to_virtual_stage) {
    return (activation * 1000 + micro_batch) * 1000 + to_virtual_stage;
}

/* The message a step sends or expects, as STAGE_MESSAGE_NBYTES / sizeof(int) copies of its id. */
static int step_message(const moe_pp_shape *shape, int stage, const moe_pp_step *st) {
    const int v = moe_pp_virtual_stage(shape, stage, st->chunk), act = is_activation(st->op);
    const int to = !is_send(st->op) ? v : act ? v + 1 : v - 1;
    return message_id(act, st->micro_batch, to);
}

static void walk_schedule(moe_comm *c, const moe_pp_shape *shape, const char *name, int early_receives, int one_tag) {
    const int me = moe_comm_rank(c), words = STAGE_MESSAGE_NBYTES / (int)sizeof(int);
    moe_pp_step *steps = NULL;
    int count = 0;
    CHECK_OK(moe_pp_schedule(shape, me, &steps, &count));
    moe_comm_request **req = calloc((size_t)count + 1, sizeof *req);
    int **buf = calloc((size_t)count + 1, sizeof *buf), bad = 0;
    for (int i = 0; i < count; i++) {
        if (!is_exchange(steps[i].op)) continue;
        buf[i] = malloc(STAGE_MESSAGE_NBYTES);
        for (int w = 0; w < words; w++) buf[i][w] = is_send(steps[i].op) ? step_message(shape, me, &steps[i]) : -1;
    }
    for (int pass = early_receives ? 0 : 1; pass < 2; pass++)
        for (int i = 0; i < count; i++) {
            const moe_pp_step *st = &steps[i];
            if (!is_exchange(st->op)) continue;
            const int tag = is_activation(st->op) || one_tag ? 0 : 1;
            if (pass == 0 || (!is_send(st->op) && !early_receives)) {
                if (!is_send(st->op))
                    CHECK_OK(moe_comm_irecv_bytes(c, buf[i], STAGE_MESSAGE_NBYTES, st->peer, tag, &req[i]));
                if (pass == 0) continue;
            }
            if (is_send(st->op)) {
                CHECK_OK(moe_comm_isend_bytes(c, buf[i], STAGE_MESSAGE_NBYTES, st->peer, tag, &req[i]));
                continue;
            }
            CHECK_OK(moe_comm_wait(c, req[i]));
            req[i] = NULL;
            const int want = step_message(shape, me, st);
            if (buf[i][0] != want || buf[i][words - 1] != want) {
                if (bad++ == 0)
                    CHECK(0, "%s: p %d V %d m %d, stage %d step %d (micro-batch %d chunk %d from %d): got message %d, "
                          "want %d", name, shape->stages, shape->virtual_stages, shape->micro_batches, me, i,
                          st->micro_batch, st->chunk, st->peer, buf[i][0], want);
            }
        }
    CHECK_OK(moe_comm_wait_all(c, req, count));
    for (int i = 0; i < count; i++) free(buf[i]);
    free(buf), free(req), free(steps);
}

void test_p2p_check_pipeline(moe_comm *c, const char *name, int early_receives, int one_tag) {
    const int p = moe_comm_size(c);
    for (int m = 1; m <= 8; m++) walk_schedule(c, &(moe_pp_shape){p, 1, m}, name, early_receives, one_tag);
    for (int m = p; m <= 2 * p; m += p) walk_schedule(c, &(moe_pp_shape){p, 2, m}, name, early_receives, one_tag);
}
