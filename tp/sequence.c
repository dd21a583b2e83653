/* sequence.c — sequence parallelism's row moves (tp/sequence.h). */
#include "tp/sequence.h"

#include <stdlib.h>

#include "core/fail.h"

size_t moe_tp_slice_first(const moe_tp_sequence *s, int T) { return (size_t)s->tp_rank * (size_t)(T / s->tp); }

moe_status moe_tp_gather_slices(const moe_tp_sequence *s, const moe_real *slice, int T, int width, moe_real *whole) {
    const size_t nbytes = (size_t)(T / s->tp) * width * sizeof(moe_real);
    return moe_comm_allgather_payload(s->group, slice, nbytes, whole);
}

moe_status moe_tp_group_rows(const moe_tp_sequence *s, const moe_real *slice, int T, int width, moe_real *scratch,
                             const moe_real **rows) {
    if (s->tp == 1) return *rows = slice, MOE_OK;
    MOE_TRY(moe_tp_gather_slices(s, slice, T, width, scratch));
    return *rows = scratch, MOE_OK;
}

moe_status moe_tp_take_slice(const moe_tp_sequence *s, const moe_real *whole, int T, int width, moe_real *slice) {
    const moe_real *mine = whole + moe_tp_slice_first(s, T) * width;
    if (mine == slice) return MOE_OK;
    return moe_runtime_copy(s->rt, slice, mine, (size_t)(T / s->tp) * width * sizeof(moe_real));
}

moe_status moe_tp_slice_all_columns(const moe_tp_sequence *s, const moe_real *local, int T, int width, moe_real *recv,
                                    moe_real *slice_all) {
    const int tp = s->tp, Ts = T / tp;
    const size_t row = (size_t)width * sizeof(moe_real);
    if (tp == 1) return moe_runtime_copy(s->rt, slice_all, local, (size_t)T * row);
    int *rows = calloc((size_t)tp, sizeof *rows); /* Ts rows to and from each rank: rank p's slice of mine */
    if (!rows) return MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < tp; p++) rows[p] = Ts;
    moe_status st = moe_comm_alltoallv_rows(s->group, local, rows, recv, rows, row);
    free(rows);
    for (int p = 0; p < tp && st == MOE_OK; p++) /* rank p's columns of my slice: [Ts, width] at column p width */
        st = moe_runtime_copy_2d(s->rt, slice_all + (size_t)p * width, (size_t)tp * row, recv + (size_t)p * Ts * width,
                                 row, row, (size_t)Ts);
    return st;
}
