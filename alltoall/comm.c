/* comm.c — what every transport shares: teardown, and agreeing on an outcome. */
#include "alltoall/comm.h"

#include <string.h>

#include "core/fail.h"

void moe_comm_destroy(moe_comm *c) {
    if (c) c->ops->destroy(c);
}

moe_status moe_comm_agree(moe_comm *c, moe_status mine) {
    double failures = mine != MOE_OK;
    moe_status st = c->ops->allreduce_sum_f64(c, &failures, 1);
    if (st != MOE_OK) return st;
    if (mine != MOE_OK) return mine;
    return failures > 0 ? moe_fail(MOE_ERR_PEER, "another rank failed (see its message)") : MOE_OK;
}

moe_status moe_comm_copy_host(moe_comm *c, void *dst, const void *src, size_t nbytes) {
    (void)c;
    memmove(dst, src, nbytes);
    return MOE_OK;
}
