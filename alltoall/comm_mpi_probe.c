/* comm_mpi_probe.c — the watchdog's question "where are you?" and its answers (comm_mpi_probe.h). */
#include "alltoall/comm_mpi_probe.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fail.h"

enum { TAG_QUESTION = 1, TAG_ANSWER = 2, ANSWER_NBYTES = 160, MAX_NAMED = 8 };

struct moe_mpi_probe {
    MPI_Comm twin;
    int size, rank;   /* of the communicator, and this process's rank in it */
    int *world_ranks; /* [size]: the world rank of each rank of the communicator */
    moe_mpi_probe *next;
};

static moe_mpi_probe *registry; /* every live twin of this process: a wait on one communicator answers on all */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

moe_status moe__mpi_probe_create(MPI_Comm comm, moe_mpi_probe **out) {
    *out = NULL;
    int size = 0, rank = 0;
    if (MPI_Comm_size(comm, &size) != MPI_SUCCESS || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_COMM, "MPI_Comm_size or MPI_Comm_rank failed");
    moe_mpi_probe *p = calloc(1, sizeof *p);
    int *ranks = malloc((size_t)size * sizeof(int));
    if (p) p->world_ranks = malloc((size_t)size * sizeof(int));
    if (!p || !ranks || !p->world_ranks) {
        if (p) free(p->world_ranks);
        return free(p), free(ranks), MOE_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < size; i++) ranks[i] = i;
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    int ok = MPI_Comm_dup(comm, &p->twin) == MPI_SUCCESS;
    ok = ok && MPI_Comm_set_errhandler(p->twin, MPI_ERRORS_RETURN) == MPI_SUCCESS;
    ok = ok && MPI_Comm_group(comm, &group) == MPI_SUCCESS && MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS;
    ok = ok && MPI_Group_translate_ranks(group, size, ranks, world, p->world_ranks) == MPI_SUCCESS;
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
    free(ranks);
    if (!ok) {
        free(p->world_ranks), free(p);
        return moe_fail(MOE_ERR_COMM, "cannot set up the watchdog's twin of a communicator over MPI");
    }
    p->size = size, p->rank = rank;
    p->next = registry;
    registry = p;
    *out = p;
    return MOE_OK;
}

void moe__mpi_probe_destroy(moe_mpi_probe *p) {
    if (!p) return;
    for (moe_mpi_probe **at = &registry; *at; at = &(*at)->next)
        if (*at == p) {
            *at = p->next;
            break;
        }
    MPI_Comm_free(&p->twin);
    free(p->world_ranks);
    free(p);
}

int moe__mpi_probe_world_rank(const moe_mpi_probe *p, int rank) { return p->world_ranks[rank]; }

void moe__mpi_probe_answer(const moe_comm *c, const char *op) {
    for (moe_mpi_probe *p = registry; p; p = p->next) {
        int pending = 0;
        MPI_Status status;
        while (MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUESTION, p->twin, &pending, &status) == MPI_SUCCESS && pending) {
            int question;
            if (MPI_Recv(&question, 1, MPI_INT, status.MPI_SOURCE, TAG_QUESTION, p->twin, MPI_STATUS_IGNORE) !=
                MPI_SUCCESS)
                return;
            char answer[ANSWER_NBYTES] = {0};
            snprintf(answer, sizeof answer, "%s on '%s' (its exchange #%ld there)", op, c->label, c->completed + 1);
            /* a few bytes: sent eagerly, MPI_Send returns at once */
            if (MPI_Send(answer, ANSWER_NBYTES, MPI_CHAR, status.MPI_SOURCE, TAG_ANSWER, p->twin) != MPI_SUCCESS)
                return;
        }
    }
}

/* Appends to out (at *used) like snprintf, never past n. */
static void append(char *out, size_t n, size_t *used, const char *fmt, ...) {
    if (*used >= n) return;
    va_list ap;
    va_start(ap, fmt);
    int wrote = vsnprintf(out + *used, n - *used, fmt, ap);
    va_end(ap);
    if (wrote > 0) *used += (size_t)wrote;
}

/* Asks every other rank of p's communicator where it is, waits up to window_s (answering the questions of others,
 * as c's wait), and appends to out (at *used) who did not answer and where the others wait. The number that did
 * not answer. */
static int ask_each(moe_mpi_probe *p, const moe_comm *c, double window_s, char *out, size_t n, size_t *used) {
    static int question; /* the sends may outlive this call (a peer that never receives them) */
    const int size = p->size, me = p->rank;
    MPI_Request *req = malloc(2 * (size_t)size * sizeof(MPI_Request)), *answer_req = req + size;
    char *answers = calloc((size_t)size, ANSWER_NBYTES);
    int *answered = calloc((size_t)size, sizeof(int));
    if (!req || !answers || !answered) {
        append(out, n, used, "(out of memory asking the peers where they are)");
        free(req), free(answers), free(answered);
        return 0;
    }
    for (int q = 0; q < size; q++) {
        req[q] = answer_req[q] = MPI_REQUEST_NULL;
        if (q == me) continue;
        if (MPI_Isend(&question, 1, MPI_INT, q, TAG_QUESTION, p->twin, &req[q]) != MPI_SUCCESS ||
            MPI_Irecv(answers + (size_t)q * ANSWER_NBYTES, ANSWER_NBYTES, MPI_CHAR, q, TAG_ANSWER, p->twin,
                      &answer_req[q]) != MPI_SUCCESS)
            answer_req[q] = MPI_REQUEST_NULL;
    }
    int waiting = size - 1;
    for (const double start = now_s(); waiting > 0 && now_s() - start < window_s; sched_yield()) {
        for (int q = 0; q < size; q++) {
            int done = 0;
            if (q == me || answered[q] || answer_req[q] == MPI_REQUEST_NULL) continue;
            if (MPI_Test(&answer_req[q], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) answered[q] = 1, waiting--;
        }
        moe__mpi_probe_answer(c, "the watchdog's questions"); /* two ranks may time out and ask each other */
    }
    int named = 0, elsewhere = 0;
    for (int q = 0; q < size; q++) {
        if (q == me || answered[q]) continue;
        if (named++ < MAX_NAMED) append(out, n, used, "%s%d", named > 1 ? ", " : "missing: world rank ", p->world_ranks[q]);
        if (answer_req[q] != MPI_REQUEST_NULL && MPI_Cancel(&answer_req[q]) == MPI_SUCCESS)
            MPI_Request_free(&answer_req[q]);
        if (req[q] != MPI_REQUEST_NULL) MPI_Request_free(&req[q]); /* the buffer is static */
    }
    if (named > MAX_NAMED) append(out, n, used, " and %d more", named - MAX_NAMED);
    if (named)
        append(out, n, used, " (no answer within %.1f s: stopped, gone, or busy outside any exchange)", window_s);
    for (int q = 0; q < size; q++) {
        if (!answered[q]) continue;
        if (req[q] != MPI_REQUEST_NULL) MPI_Wait(&req[q], MPI_STATUS_IGNORE); /* it answered: it has the question */
        if (elsewhere++ < MAX_NAMED)
            append(out, n, used, "%sworld rank %d waits in %s", named || elsewhere > 1 ? "; " : "",
                   p->world_ranks[q], answers + (size_t)q * ANSWER_NBYTES);
    }
    if (elsewhere > MAX_NAMED) append(out, n, used, "; %d more answered", elsewhere - MAX_NAMED);
    if (!named && !elsewhere) append(out, n, used, "no other rank in it");
    free(req), free(answers), free(answered);
    return named;
}

void moe__mpi_probe_ask(moe_mpi_probe *p, const moe_comm *c, double window_s, char *out, size_t n) {
    size_t used = 0;
    out[0] = 0;
    if (ask_each(p, c, window_s, out, n, &used)) return;
    /* Every peer answered: each waits on someone else (under pp x tp, a stage's ranks wait on their tensor group,
     * whose stopped member is not in this communicator). Ask the widest communicator, the world, too. */
    moe_mpi_probe *widest = p;
    for (moe_mpi_probe *q = registry; q; q = q->next)
        if (q->size > widest->size) widest = q;
    if (widest == p) return;
    append(out, n, &used, "; every rank of it answered, so all %d ranks were asked: ", widest->size);
    ask_each(widest, c, window_s, out, n, &used);
}
