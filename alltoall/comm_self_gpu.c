/* comm_self_gpu.c — the self-gpu transport (comm_gpu.h): a world of one whose payloads live on the device.
 * Rows move by a device-to-device copy queued on the context's stream (so the exchange is ordered with the
 * kernels around it and returns without waiting); the all-reduce of one rank leaves the buffer as it is.
 * Point-to-point messages to itself follow the self transport's matching, with device copies.
 * The control entries (host pointers) are those of the self transport, reached through an inner self
 * comm, so their semantics stay defined in one place (comm_self.c).
 * Checked by tests/test_gpu_alltoall.c and, for the fixed-tree all-reduce, tests/test_gpu_tree_allreduce.c
 * (meson test --suite gpu; skips without a GPU). */
#include <stdlib.h>

#include "alltoall/comm_forward.h"
#include "alltoall/comm_gpu.h"
#include "core/gpu_cuda.h"

typedef struct {
    moe_comm *inner;      /* the self transport: control entries */
    moe_gpu *gpu;         /* payload copies run on gpu->stream */
    moe__self_p2p *queue; /* point-to-point posts not yet matched (comm_self.c's rule, device copies) */
} self_gpu_state;

/* send and recv: device buffers of send_rows[0] == recv_rows[0] rows; the same pointer twice is a no-op. */
static moe_status self_gpu_alltoallv_rows(moe_comm *c, const void *send, const int *send_rows, void *recv,
                                          const int *recv_rows, size_t row_nbytes) {
    if (send_rows[0] != recv_rows[0]) return MOE_ERR_COUNT_MISMATCH;
    if (send_rows[0] < 0) return MOE_ERR_INVALID_ARG;
    MOE_TRY(moe_gpu_copy(((self_gpu_state *)c->impl)->gpu, recv, send, (size_t)send_rows[0] * row_nbytes));
    c->completed++;
    return MOE_OK;
}

/* device to device, queued on the stream; dst and src must not overlap unless equal */
static moe_status self_gpu_copy_payload(moe_comm *c, void *dst, const void *src, size_t nbytes) {
    return moe_gpu_copy(((self_gpu_state *)c->impl)->gpu, dst, src, nbytes);
}

static moe_status self_gpu_allreduce_real(moe_comm *c, moe_real *buf, size_t count) {
    (void)buf, (void)count;
    c->completed++;
    return MOE_OK;
}

/* Matched by comm_self.c's rule; the bytes move by self_gpu_copy_payload when both sides are posted, queued on
 * the stream after the kernels queued before the later post, before those queued after the waits. */
static moe_status self_gpu_post(moe_comm *c, const moe_comm_request *what, moe_comm_request **req) {
    return moe__self_p2p_post(c, &((self_gpu_state *)c->impl)->queue, what, req);
}

static moe_status self_gpu_wait(moe_comm *c, moe_comm_request *req) {
    return moe__self_p2p_wait(c, &((self_gpu_state *)c->impl)->queue, req);
}

static void self_gpu_destroy(moe_comm *c) {
    self_gpu_state *s = c->impl;
    moe__self_p2p_free(s->queue);
    moe_comm_destroy(s->inner);
    free(s);
    free(c);
}

static const moe_transport_ops self_gpu_ops = {
    .name = "self-gpu",
    .alltoall_ints = moe__comm_forward_alltoall_ints,
    .alltoallv_rows = self_gpu_alltoallv_rows,
    .alltoallv_host_rows = moe__comm_forward_alltoallv_host_rows,
    .allgatherv_bytes = moe__comm_forward_allgatherv_bytes,
    .allreduce_sum_real = self_gpu_allreduce_real,
    .allreduce_sum_f64 = moe__comm_forward_allreduce_f64,
    .tree_real = moe__comm_tree_one, /* the tree of one rank: its own buffer */
    .allreduce_tree_f64 = moe__comm_forward_allreduce_tree_f64,
    .scan_sum_ints = moe__comm_forward_scan_ints,
    .barrier = moe__comm_forward_barrier,
    .copy_payload = self_gpu_copy_payload,
    .post = self_gpu_post,
    .wait = self_gpu_wait,
    .batch = moe__comm_batch_none, /* a post copies as soon as its match exists */
    .destroy = self_gpu_destroy,
};

moe_status moe_comm_create_self_gpu(moe_gpu *gpu, const char *label, moe_comm **out) {
    if (!gpu || !out) return MOE_ERR_INVALID_ARG;
    moe_comm *c = calloc(1, sizeof *c);
    self_gpu_state *s = calloc(1, sizeof *s);
    moe_comm *inner = NULL;
    if (!c || !s || moe_comm_create_self(label, &inner) != MOE_OK) return free(c), free(s), MOE_ERR_OUT_OF_MEMORY;
    *s = (self_gpu_state){.inner = inner, .gpu = gpu};
    *c = (moe_comm){.ops = &self_gpu_ops, .rank = inner->rank, .size = inner->size, .label = label,
                    .world_rank = inner->world_rank, .timeout_s = inner->timeout_s, .impl = s};
    *out = c;
    return MOE_OK;
}
