/* test_p2p_self.c — point-to-point on the self transport (a world of one, alltoall/comm.h): the shared driver
 * (tests/test_p2p.h) on host memory, then what only a world of one can tell at once: a wait whose match was never
 * posted fails immediately (nothing else could post it) with a message naming it, a size mismatch fails at the post
 * that meets it, messages with one tag match in posting order, and waits are timed under MOE_EXCHANGE_P2P; the
 * pipeline schedules' exchanges of one stage (p = 1, V = 2: a rank sending to itself). */
#include <string.h>
#include <time.h>

#include "alltoall/comm.h"
#include "alltoall/comm_timing.h"
#include "core/fail.h"
#include "tests/test_p2p.h"
#include "tests/test_util.h"

static void check_never_matched(moe_comm *c) {
    char buf[4] = {0};
    moe_comm_request *req = NULL;
    const time_t start = time(NULL);
    CHECK_OK(moe_comm_isend_bytes(c, buf, sizeof buf, 0, 5, &req));
    moe_status st = moe_comm_wait(c, req);
    CHECK(st == MOE_ERR_COMM, "a send never received: %s", moe_status_string(st));
    const char *msg = moe_failure_message(st);
    CHECK(strstr(msg, "send of 4 bytes to rank 0 with tag 5") && strstr(msg, "can never complete"),
          "the message does not name the send: %s", msg);
    CHECK_OK(moe_comm_irecv_bytes(c, buf, sizeof buf, 0, 6, &req));
    st = moe_comm_wait(c, req);
    CHECK(st == MOE_ERR_COMM && strstr(moe_failure_message(st), "receive of 4 bytes from rank 0 with tag 6"),
          "a receive never sent: %s", moe_failure_message(st));
    CHECK(time(NULL) - start < 2, "the failures took %ld s: they must not wait", (long)(time(NULL) - start));
}

static void check_size_mismatch(moe_comm *c) {
    char send[8] = "1234567", recv[8] = {0};
    moe_comm_request *r = NULL, *s = NULL;
    CHECK_OK(moe_comm_irecv_bytes(c, recv, 8, 0, 2, &r));
    moe_status st = moe_comm_isend_bytes(c, send, 4, 0, 2, &s);
    CHECK(st == MOE_ERR_COUNT_MISMATCH && !s, "4 bytes sent into a receive of 8: %s", moe_status_string(st));
    CHECK(strstr(moe_failure_message(st), "meets a receive of 8 bytes"), "message: %s", moe_failure_message(st));
    CHECK_OK(moe_comm_isend_bytes(c, send, 8, 0, 2, &s)); /* the receive is still posted: this one matches */
    CHECK_OK(moe_comm_wait(c, s));
    CHECK_OK(moe_comm_wait(c, r));
    CHECK(!memcmp(recv, send, 8), "the receive got '%.7s'", recv);
}

/* two sends with one tag, then two receives: the first receive gets the first send; another tag in between */
static void check_posting_order(moe_comm *c) {
    char a[2] = "a", b[2] = "b", x[2] = "x", got[3][2] = {{0}};
    moe_comm_request *req[6];
    CHECK_OK(moe_comm_isend_bytes(c, a, 2, 0, 3, &req[0]));
    CHECK_OK(moe_comm_isend_bytes(c, x, 2, 0, 4, &req[1]));
    CHECK_OK(moe_comm_isend_bytes(c, b, 2, 0, 3, &req[2]));
    CHECK_OK(moe_comm_irecv_bytes(c, got[0], 2, 0, 3, &req[3]));
    CHECK_OK(moe_comm_irecv_bytes(c, got[1], 2, 0, 3, &req[4]));
    CHECK_OK(moe_comm_irecv_bytes(c, got[2], 2, 0, 4, &req[5]));
    CHECK_OK(moe_comm_wait_all(c, req, 6));
    CHECK(got[0][0] == 'a' && got[1][0] == 'b' && got[2][0] == 'x', "received %c %c %c, want a b x", got[0][0],
          got[1][0], got[2][0]);
}

static void check_timed(moe_comm *c) {
    moe_exchange_times times = {0};
    moe_comm_time_exchanges(c, &times);
    char s = 1, r = 0;
    moe_comm_request *req[2];
    CHECK_OK(moe_comm_irecv_bytes(c, &r, 1, 0, 0, &req[0]));
    CHECK_OK(moe_comm_isend_bytes(c, &s, 1, 0, 0, &req[1]));
    CHECK_OK(moe_comm_wait_all(c, req, 2));
    moe_comm_time_exchanges(c, NULL);
    CHECK(times.calls[MOE_EXCHANGE_P2P] == 2 && r == 1, "%ld waits timed as p2p, want 2",
          times.calls[MOE_EXCHANGE_P2P]);
    CHECK(!strcmp(moe_exchange_kind_name(MOE_EXCHANGE_P2P), "p2p"), "kind name %s",
          moe_exchange_kind_name(MOE_EXCHANGE_P2P));
}

int main(void) {
    moe_comm *c;
    CHECK_OK(moe_comm_create_self("self", &c));
    test_p2p_check(c, &test_p2p_host, "self", 1);
    check_never_matched(c);
    check_size_mismatch(c);
    check_posting_order(c);
    check_timed(c);
    test_p2p_check_pipeline(c, "self pipeline", 0, 0); /* p = 1: with V = 2 chunk 0 sends to chunk 1 on its own rank */
    test_p2p_check_pipeline(c, "self pipeline, receives posted early", 1, 0);
    moe_comm_destroy(c);
    return test_finish("test_p2p_self");
}
