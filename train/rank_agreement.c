/* rank_agreement.c — every rank's options the same, and agreed failures told once (train/rank_agreement.h). */
#include "train/rank_agreement.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "core/fnv1a.h"

/* equal texts hash equal; a collision between two ranks' different values is 2^-64 */
static uint64_t hash_text(const char *text) { return moe_fnv1a(MOE_FNV1A_SEED, text, strlen(text)); }

int moe_train_options_agree(int parsed, const moe_train_options *o, MPI_Comm world, FILE *err) {
    int count;
    const moe_train_option *table = moe_train_option_table(&count);
    /* [0]: the parse's outcome, [1 + i]: option i's value (0 where it is not compared or the parse failed) */
    uint64_t *mine = calloc((size_t)count + 1, sizeof *mine), *lo = calloc((size_t)count + 1, sizeof *lo),
             *hi = calloc((size_t)count + 1, sizeof *hi);
    int agreed = -1;
    if (mine && lo && hi) {
        mine[0] = (uint64_t)(parsed + 2); /* -1, 0, 1 as 1, 2, 3 */
        char value[4096];
        for (int i = 0; i < count && parsed == 0; i++) {
            const moe_train_option *s = &table[i];
            if (s->scope == MOE_OPT_SCOPE_FLAG_ONLY || s->offset == offsetof(moe_train_options, threads)) continue;
            moe_train_option_format(o, s, 0, value, sizeof value);
            mine[1 + i] = hash_text(value);
        }
    }
    /* every rank takes part whatever its allocation did: all stop where one failed */
    const int n = mine && lo && hi ? count + 1 : 0;
    int ok = n > 0, all_ok = 0;
    if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, world) != MPI_SUCCESS ||
        (all_ok && (MPI_Allreduce(mine, lo, n, MPI_UINT64_T, MPI_MIN, world) != MPI_SUCCESS ||
                    MPI_Allreduce(mine, hi, n, MPI_UINT64_T, MPI_MAX, world) != MPI_SUCCESS))) {
        moe_train_complain(err, "moe-train: MPI_Allreduce failed while the ranks compared their options\n");
        all_ok = -1;
    }
    if (all_ok > 0) {
        int differs = lo[0] != hi[0] ? 0 : -1;
        for (int i = 0; i < count && differs < 0; i++)
            if (lo[1 + i] != hi[1 + i]) differs = 1 + i;
        if (differs < 0) {
            agreed = parsed;
        } else if (differs == 0) {
            moe_train_complain(err, "moe-train: the ranks' command lines differ: some were refused and some not (an "
                                    "MPMD launch, or a --config file that differs from node to node?): every rank "
                                    "needs the same options\n");
        } else {
            char value[4096];
            moe_train_option_format(o, &table[differs - 1], 0, value, sizeof value);
            moe_train_complain(err, "moe-train: the ranks were given different values of %s (rank 0: %s): every rank "
                                    "needs the same options (an MPMD launch, or a --config file that differs from node "
                                    "to node?)\n", table[differs - 1].name, value);
        }
    } else if (all_ok == 0) {
        moe_train_complain(err, "moe-train: out of memory\n");
    }
    free(mine), free(lo), free(hi);
    return agreed;
}

moe_status moe_train_agree(MPI_Comm world, moe_status mine) {
    int failed = mine != MOE_OK, any = failed;
    if (MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, world) != MPI_SUCCESS)
        return moe_fail(MOE_ERR_COMM, "MPI_Allreduce failed while the ranks agreed on their start");
    return failed ? mine : any ? moe_fail(MOE_ERR_PEER, "another rank failed (see its message)") : MOE_OK;
}

void moe_train_report_agreed_failure(moe_status st, const char *what, MPI_Comm world) {
    int rank, size;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    const char *message = moe_failure_message(st);
    const uint64_t mine = st == MOE_ERR_PEER ? 0 : hash_text(message) | 1; /* 0: nothing of its own to say */
    uint64_t *all = malloc((size_t)size * sizeof *all);
    if (!all || MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, world) != MPI_SUCCESS) {
        if (mine) fprintf(stderr, "moe-train: rank %d: %s: %s\n", rank, what, message); /* each its own line, then */
        free(all);
        return;
    }
    int first = rank, alike = 0;
    for (int r = 0; r < size; r++)
        if (all[r] == mine) alike++, first = r < first ? r : first;
    if (mine && first == rank) {
        char others[64] = "";
        if (alike > 1) snprintf(others, sizeof others, " (and %d other%s alike)", alike - 1, alike > 2 ? "s" : "");
        fprintf(stderr, "moe-train: rank %d%s: %s: %s\n", rank, others, what, message);
    }
    free(all);
}
