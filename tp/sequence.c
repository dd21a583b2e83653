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

/* Two lists of tp row counts, Ts each, for an all-to-all's sends and receipts (rows[p], rows[tp + p]); NULL when out
 * of memory. */
static int *row_counts(int tp, int Ts) {
    int *rows = malloc(2 * (size_t)tp * sizeof *rows);
    for (int i = 0; rows && i < 2 * tp; i++) rows[i] = Ts;
    return rows;
}

moe_status moe_tp_slice_all_columns(const moe_tp_sequence *s, const moe_real *local, int T, int width, int sharing,
                                    moe_real *recv, moe_real *slice_all) {
    const int tp = s->tp, Ts = T / tp, blocks = tp / sharing;
    const size_t row = (size_t)width * sizeof(moe_real);
    if (tp == 1) return moe_runtime_copy(s->rt, slice_all, local, (size_t)T * row);
    int *rows = row_counts(tp, Ts); /* a block's first holder sends rank p its slice's rows; the others nothing */
    if (!rows) return MOE_ERR_OUT_OF_MEMORY;
    for (int p = 0; p < tp; p++) {
        if (s->tp_rank % sharing) rows[p] = 0;
        if (p % sharing) rows[tp + p] = 0;
    }
    moe_status st = moe_comm_alltoallv_rows(s->group, local, rows, recv, rows + tp, row);
    free(rows);
    for (int b = 0; b < blocks && st == MOE_OK; b++) /* block b's part of my slice: [Ts, width] at column b width */
        st = moe_runtime_copy_2d(s->rt, slice_all + (size_t)b * width, (size_t)blocks * row,
                                 recv + (size_t)b * Ts * width, row, row, (size_t)Ts);
    return st;
}

moe_status moe_tp_own_columns(const moe_tp_sequence *s, const moe_real *slice_all, int T, int width, int sharing,
                              moe_real *send, moe_real *local) {
    const int tp = s->tp, Ts = T / tp, blocks = tp / sharing;
    const size_t row = (size_t)width * sizeof(moe_real);
    if (tp == 1) return moe_runtime_copy(s->rt, local, slice_all, (size_t)T * row);
    moe_status st = MOE_OK;
    for (int p = 0; p < tp && st == MOE_OK; p++) /* rank p's part: my slice's rows of its block */
        st = moe_runtime_copy_2d(s->rt, send + (size_t)p * Ts * width, row,
                                 slice_all + (size_t)(p / sharing) * width, (size_t)blocks * row, row, (size_t)Ts);
    int *rows = row_counts(tp, Ts); /* rank p's slice of my block lands at its rows of local */
    if (st == MOE_OK && !rows) st = MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = moe_comm_alltoallv_rows(s->group, send, rows, local, rows + tp, row);
    free(rows);
    return st;
}
