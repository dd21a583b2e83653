/* sequence.c — sequence parallelism's row moves (tp/sequence.h). */
#include "tp/sequence.h"
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
