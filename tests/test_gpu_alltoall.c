/* test_gpu_alltoall.c — the GPU transports (comm_gpu.h) checked exactly, and against the MPI transport on
 * host buffers (nccl-tests: data that only moves must match to the bit; DeepEP: rows encode their origin).
 * Under mpirun -np W (meson: W = 1 and 2, every rank on GPU 0 unless there are enough devices):
 *   self-gpu    on every rank, a world of one, against the self transport
 *   mpi-staged  on the world (ranks may share a GPU), against the MPI transport
 *   nccl        (builds with NCCL) when every rank has a device of its own: W = 1, or W <= device count
 * Each: alltoallv of rows of uint16 words (several widths, uneven counts with zeros, an all-zero round)
 * whose words are (source rank, destination rank, row index, pattern), written into the send buffer by a
 * copy still queued on the compute stream and read back through another queued copy (the transport must
 * order itself against that stream), with guard bytes after the received rows that must stay poisoned;
 * allreduce_sum_real of small integers (exact in float); copy_payload; the control entries on host
 * buffers; the count of completed exchanges; point-to-point sends and receives (the driver of tests/test_p2p.h on
 * device buffers written and read through copies queued on the compute stream; nccl, which carries no tags: its
 * batched ring only).
 * Exit 77 (skip) on every rank when a rank has no GPU: the ranks agree, finalize MPI, and return 77, which
 * mpirun passes on as its own exit code. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alltoall/comm_gpu_mpi.h"
#include "alltoall/comm_mpi.h"
#include "alltoall/comm_transport.h" /* white box: world rank, timeout and exchange counts */
#include "tests/test_gpu_util.h"
#include "tests/test_mpi.h"
#include "tests/test_p2p.h"

enum { GUARD_NBYTES = 64, ALLREDUCE_COUNT = 1003 };

typedef struct {
    const char *name;
    moe_comm *dev;  /* the transport under test: payloads on the device */
    moe_comm *host; /* the reference: the same exchange on host buffers */
    moe_gpu *gpu;
} transport_pair;

/* rows that rank `src` sends to rank `dst` in `round` (zeros included; round 3: none at all) */
static int rows_between(int src, int dst, int round) { return round == 3 ? 0 : (3 * src + 5 * dst + round) % 4; }

/* word w of row i from src to dst */
static uint16_t provenance(int src, int dst, int i, int w) {
    if (w == 0) return (uint16_t)(src * 256 + dst);
    if (w == 1) return (uint16_t)i;
    return (uint16_t)(i * 7 + w * 3 + src * 11 + dst);
}

/* rows in peer order: for each peer p, n(p) rows between `me` and p in the given direction */
static uint16_t *rows_in_peer_order(int me, int size, int round, int words, int receiving, int counts[]) {
    size_t total = 0;
    for (int p = 0; p < size; p++) {
        counts[p] = receiving ? rows_between(p, me, round) : rows_between(me, p, round);
        total += (size_t)counts[p];
    }
    uint16_t *rows = malloc((total ? total : 1) * (size_t)words * sizeof *rows), *at = rows;
    for (int p = 0; p < size; p++)
        for (int i = 0; i < counts[p]; i++)
            for (int w = 0; w < words; w++) *at++ = receiving ? provenance(p, me, i, w) : provenance(me, p, i, w);
    return rows;
}

static void check_alltoallv(const transport_pair *t, int round, int words) {
    moe_comm *c = t->dev;
    const size_t row_nbytes = (size_t)words * sizeof(uint16_t);
    int *send_rows = malloc(2 * (size_t)moe_comm_size(c) * sizeof(int)), *recv_rows = send_rows + moe_comm_size(c);
    uint16_t *send = rows_in_peer_order(moe_comm_rank(c), moe_comm_size(c), round, words, 0, send_rows);
    uint16_t *want = rows_in_peer_order(moe_comm_rank(c), moe_comm_size(c), round, words, 1, recv_rows);
    size_t send_nbytes = 0, recv_nbytes = 0;
    for (int p = 0; p < moe_comm_size(c); p++)
        send_nbytes += (size_t)send_rows[p] * row_nbytes, recv_nbytes += (size_t)recv_rows[p] * row_nbytes;

    /* the reference on host buffers */
    unsigned char *host_recv = malloc(recv_nbytes + 1);
    CHECK_OK(moe_comm_alltoallv_rows(t->host, send, send_rows, host_recv, recv_rows, row_nbytes));
    CHECK(!memcmp(host_recv, want, recv_nbytes), "%s round %d width %zu: the host transport's rows differ", t->name,
          round, row_nbytes);

    /* the device: send written and recv read by copies queued on the compute stream around the exchange */
    void *dev_src = test_gpu_upload(t->gpu, send, send_nbytes);
    void *dev_send = test_gpu_alloc(t->gpu, send_nbytes);
    void *dev_recv = test_gpu_alloc(t->gpu, recv_nbytes + GUARD_NBYTES);
    void *dev_out = test_gpu_alloc(t->gpu, recv_nbytes + GUARD_NBYTES);
    CHECK_OK(moe_gpu_copy(t->gpu, dev_send, dev_src, send_nbytes));
    const long before = c->completed;
    CHECK_OK(moe_comm_alltoallv_rows(c, dev_send, send_rows, dev_recv, recv_rows, row_nbytes));
    CHECK(c->completed == before + 1, "%s: completed went from %ld to %ld over one exchange", t->name, before,
          c->completed);
    CHECK_OK(moe_comm_copy_payload(c, dev_out, dev_recv, recv_nbytes + GUARD_NBYTES));
    unsigned char *got = malloc(recv_nbytes + GUARD_NBYTES);
    test_gpu_download(t->gpu, got, dev_out, recv_nbytes + GUARD_NBYTES);

    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < recv_nbytes / sizeof(uint16_t); i++) {
        uint16_t g;
        memcpy(&g, got + i * sizeof g, sizeof g);
        if (g != want[i] && bad++ == 0) first_bad = i;
    }
    CHECK(bad == 0, "%s rank %d round %d width %zu: %zu of %zu words wrong, first at row %zu word %zu", t->name,
          moe_comm_rank(c), round, row_nbytes, bad, recv_nbytes / sizeof(uint16_t), first_bad / words, first_bad % words);
    CHECK(!memcmp(got, host_recv, recv_nbytes), "%s rank %d round %d: device rows differ from the host transport's",
          t->name, moe_comm_rank(c), round);
    int guard_ok = 1;
    for (size_t i = recv_nbytes; i < recv_nbytes + GUARD_NBYTES; i++) guard_ok &= got[i] == 0xFF;
    CHECK(guard_ok, "%s rank %d round %d: bytes written past the %zu received", t->name, moe_comm_rank(c), round, recv_nbytes);

    test_gpu_free(t->gpu, dev_src), test_gpu_free(t->gpu, dev_send);
    test_gpu_free(t->gpu, dev_recv), test_gpu_free(t->gpu, dev_out);
    free(send_rows), free(send), free(want), free(host_recv), free(got);
}

/* (rank + 1) * (i % 7) + i % 3 summed over W ranks: W (W + 1) / 2 * (i % 7) + W * (i % 3), exact in float */
static void check_allreduce(const transport_pair *t, size_t count) {
    moe_comm *c = t->dev;
    const int W = moe_comm_size(c);
    moe_real *buf = malloc(count * sizeof *buf), *host = malloc(count * sizeof *host);
    for (size_t i = 0; i < count; i++) buf[i] = host[i] = (moe_real)((moe_comm_rank(c) + 1) * (int)(i % 7) + (int)(i % 3));
    moe_real *dev = test_gpu_upload(t->gpu, buf, count * sizeof *buf);
    const long before = c->completed;
    CHECK_OK(moe_comm_allreduce_sum_real(c, dev, count));
    CHECK(c->completed == before + 1, "%s: completed went from %ld to %ld over one all-reduce", t->name, before,
          c->completed);
    test_gpu_download(t->gpu, buf, dev, count * sizeof *buf);
    CHECK_OK(moe_comm_allreduce_sum_real(t->host, host, count));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        moe_real want = (moe_real)(W * (W + 1) / 2 * (int)(i % 7) + W * (int)(i % 3));
        bad += buf[i] != want || host[i] != want;
    }
    CHECK(bad == 0, "%s rank %d: allreduce of %zu values: %zu differ from the exact sums", t->name, moe_comm_rank(c), count,
          bad);
    test_gpu_free(t->gpu, dev);
    free(buf), free(host);
}

static void check_control(const transport_pair *t) {
    moe_comm *c = t->dev;
    const int W = moe_comm_size(c), me = moe_comm_rank(c);
    int *ints = malloc(4 * (size_t)W * sizeof(int)), *recv = ints + 2 * W;
    for (int p = 0; p < W; p++) ints[2 * p] = me * 100 + p, ints[2 * p + 1] = -(me * 100 + p);
    CHECK_OK(moe_comm_alltoall_ints(c, ints, recv, 2));
    for (int p = 0; p < W; p++)
        CHECK(recv[2 * p] == p * 100 + me && recv[2 * p + 1] == -(p * 100 + me), "%s: alltoall_ints from peer %d",
              t->name, p);

    size_t *nbytes = malloc((size_t)W * sizeof *nbytes), total = 0;
    for (int p = 0; p < W; p++) total += nbytes[p] = (size_t)p + 1;
    unsigned char mine[64], *all = malloc(total);
    memset(mine, me + 1, sizeof mine);
    CHECK_OK(moe_comm_allgatherv_bytes(c, mine, (size_t)me + 1, all, nbytes));
    for (size_t at = 0, p = 0; p < (size_t)W; at += nbytes[p], p++)
        for (size_t i = 0; i < nbytes[p]; i++)
            CHECK(all[at + i] == p + 1, "%s: allgatherv byte %zu of rank %zu", t->name, i, p);

    double x[2] = {me + 0.5, 1};
    CHECK_OK(moe_comm_allreduce_sum_f64(c, x, 2));
    CHECK(x[0] == W * (W - 1) / 2.0 + 0.5 * W && x[1] == W, "%s: allreduce_sum_f64 gave %g %g", t->name, x[0], x[1]);
    CHECK_OK(moe_comm_barrier(c));
    free(ints), free(nbytes), free(all);
}

/* ---- point-to-point: the shared driver on device memory ----
 * A payload is written by a copy queued on the compute stream from a staging buffer, so the transport's send must
 * order itself after it; the staging buffers are freed once the stream has drained (check_p2p's end). */
enum { MAX_STAGING = 512 };
typedef struct {
    moe_gpu *gpu;
    void *staging[MAX_STAGING];
    int num_staging;
} device_memory;

static void release_staging(device_memory *m) {
    CHECK_OK(moe_gpu_synchronize(m->gpu));
    for (int i = 0; i < m->num_staging; i++) test_gpu_free(m->gpu, m->staging[i]);
    m->num_staging = 0;
}

static void *device_alloc(void *ctx, size_t nbytes) { return test_gpu_alloc(((device_memory *)ctx)->gpu, nbytes); }

static void device_write(void *ctx, void *buf, const void *host, size_t nbytes) {
    device_memory *m = ctx;
    if (m->num_staging == MAX_STAGING) release_staging(m);
    void *src = m->staging[m->num_staging++] = test_gpu_upload(m->gpu, host, nbytes);
    CHECK_OK(moe_gpu_copy(m->gpu, buf, src, nbytes));
}

/* through a copy queued after the wait: the transport must have ordered the stream after the receive */
static void device_read(void *ctx, void *host, const void *buf, size_t nbytes) {
    device_memory *m = ctx;
    void *out = test_gpu_alloc(m->gpu, nbytes);
    CHECK_OK(moe_gpu_copy(m->gpu, out, buf, nbytes));
    test_gpu_download(m->gpu, host, out, nbytes);
    test_gpu_free(m->gpu, out);
}

static void device_release(void *ctx, void *buf) {
    device_memory *m = ctx;
    CHECK_OK(moe_gpu_synchronize(m->gpu)); /* a queued copy may still read it */
    test_gpu_free(m->gpu, buf);
}

static void check_p2p(const transport_pair *t) {
    device_memory m = {.gpu = t->gpu};
    const test_p2p_memory mem = {device_alloc, device_write, device_read, device_release, &m};
    test_p2p_check(t->dev, &mem, t->name, strcmp(t->name, "nccl") != 0);
    release_staging(&m);
}

static void check_transport(const transport_pair *t) {
    CHECK(moe_comm_rank(t->dev) == moe_comm_rank(t->host) && moe_comm_size(t->dev) == moe_comm_size(t->host), "%s: rank %d of %d, the reference %d of %d",
          t->name, moe_comm_rank(t->dev), moe_comm_size(t->dev), moe_comm_rank(t->host), moe_comm_size(t->host));
    for (int round = 0; round < 4; round++) {
        check_alltoallv(t, round, 3); /* 6-byte rows: not a multiple of 4 */
        check_alltoallv(t, round, 2);
        check_alltoallv(t, round, 65);
    }
    check_allreduce(t, 1);
    check_allreduce(t, ALLREDUCE_COUNT);
    check_control(t);
    check_p2p(t);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
        printf("%-10s on %d rank(s): exchanges, all-reduce, control entries and point-to-point checked\n", t->name,
               moe_comm_size(t->dev));
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int W, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const int min_devices =
        test_mpi_min_devices_or_skip(test_gpu_device_count("test_gpu_alltoall"), "test_gpu_alltoall");
    moe_gpu *gpu = test_gpu_require("test_gpu_alltoall"); /* device 0, shared by all ranks */

    transport_pair self = {.name = "self-gpu", .gpu = gpu};
    test_mpi_require(moe_comm_create_self_gpu(gpu, "self-gpu", &self.dev), "self-gpu comm");
    test_mpi_require(moe_comm_create_self("self", &self.host), "self comm");
    check_transport(&self);
    moe_comm_destroy(self.dev), moe_comm_destroy(self.host);

    transport_pair staged = {.name = "mpi-staged", .gpu = gpu};
    test_mpi_require(moe_comm_create_mpi_staged(gpu, test_mpi_dup_world(), "staged", 60, &staged.dev),
                     "mpi-staged comm");
    test_mpi_require(moe_comm_create_mpi(test_mpi_dup_world(), "mpi", 60, &staged.host), "mpi comm");
    CHECK(!strcmp(moe_comm_transport_name(staged.dev), "mpi-staged") && staged.dev->world_rank == rank && staged.dev->timeout_s == 60,
          "mpi-staged: name %s, world rank %d, timeout %g", moe_comm_transport_name(staged.dev), staged.dev->world_rank,
          staged.dev->timeout_s);
    check_transport(&staged);
    moe_comm_destroy(staged.dev), moe_comm_destroy(staged.host);

#ifdef MOE_HAVE_NCCL
    if (W == 1 || min_devices >= W) {
        /* NCCL refuses two ranks on one device: one each */
        moe_gpu *own = gpu;
        if (W > 1) test_mpi_require(moe_gpu_create(rank, &own), "context on a device of this rank's own");
        transport_pair nccl = {.name = "nccl", .gpu = own};
        test_mpi_require(moe_comm_create_nccl(own, test_mpi_dup_world(), "nccl", 60, &nccl.dev), "nccl comm");
        test_mpi_require(moe_comm_create_mpi(test_mpi_dup_world(), "mpi", 60, &nccl.host), "mpi comm");
        check_transport(&nccl);
        moe_comm_destroy(nccl.dev), moe_comm_destroy(nccl.host);
        if (own != gpu) moe_gpu_destroy(own);
    } else if (rank == 0) {
        printf("nccl       not checked: %d ranks share %d device(s)\n", W, min_devices);
    }
#else
    if (rank == 0) printf("nccl       not in this build\n");
#endif

    moe_gpu_destroy(gpu);
    return test_mpi_finish("test_gpu_alltoall");
}
