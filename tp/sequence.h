/* sequence.h — sequence parallelism's row moves (Megatron's, beside tp/linear.h): a tensor group of tp ranks reads
 * the same T token rows; between the tensor-parallel linears each rank keeps only its slice of them, rows
 * [tp_rank Ts, (tp_rank + 1) Ts) with Ts = T / tp (at tp 1 the slice is every row). The norms, MoE layers and head
 * run on the slice; attention's and a dense FFN's column-parallel linears need the group's whole T rows, gathered
 * from the slices in rank order (an all-gather: exact, no arithmetic), and a row-parallel linear's summed output is
 * cut back to the slice. Runtime memory throughout (host on the CPU, device on CUDA). Host syncs: those of the
 * group's all-gather. */
#ifndef MOE_TP_SEQUENCE_H
#define MOE_TP_SEQUENCE_H

#include <stddef.h>

#include "alltoall/comm.h"
#include "core/real.h"
#include "moe/runtime.h"

typedef struct {
    moe_comm *group; /* the tensor group (moe_parallel_tensor) */
    moe_runtime *rt;
    int tp, tp_rank;
} moe_tp_sequence;

/* The first of this rank's rows among the group's T. */
size_t moe_tp_slice_first(const moe_tp_sequence *s, int T);
/* whole[T, width] from every rank's slice[T / tp, width], in rank order. */
moe_status moe_tp_gather_slices(const moe_tp_sequence *s, const moe_real *slice, int T, int width, moe_real *whole);
/* The group's T rows: the slice itself at tp 1 (*rows = slice), else gathered into scratch (*rows = scratch). */
moe_status moe_tp_group_rows(const moe_tp_sequence *s, const moe_real *slice, int T, int width, moe_real *scratch,
                             const moe_real **rows);
/* slice[T / tp, width] = this rank's rows of whole[T, width]; nothing to do at tp 1 when slice is whole. slice may
 * be whole's own start (its rows lie after it, or are it). */
moe_status moe_tp_take_slice(const moe_tp_sequence *s, const moe_real *whole, int T, int width, moe_real *slice);

/* slice_all[T / tp, tp * width]: this rank's slice rows with every rank's columns, from each rank's local[T, width]
 * (the group's rows of that rank's own columns: its heads), rank p's at columns [p width, (p + 1) width): an
 * all-to-all of the slices (exact, no arithmetic), landing in recv [T, width], then a strided copy. At tp 1 a copy. */
moe_status moe_tp_slice_all_columns(const moe_tp_sequence *s, const moe_real *local, int T, int width, moe_real *recv,
                                    moe_real *slice_all);

#endif
