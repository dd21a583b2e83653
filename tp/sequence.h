/* sequence.h — sequence parallelism's row moves (Megatron's, beside tp/linear.h): a tensor group of tp ranks reads
 * the same T token rows; between the tensor-parallel linears each rank keeps only its slice of them, rows
 * [tp_rank Ts, (tp_rank + 1) Ts) with Ts = T / tp (at tp 1 the slice is every row). The norms, MoE layers and head
 * run on the slice; attention's and a dense FFN's column-parallel linears need the group's whole T rows, gathered
 * from the slices in rank order (an all-gather: exact, no arithmetic), and a row-parallel linear's summed output is
 * cut back to the slice. Runtime memory throughout (host on the CPU, device on CUDA). Host syncs: those of the
 * group's all-gather and all-to-all (moe_comm_allgather_payload, moe_comm_alltoallv_rows). */
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

/* Rows against columns: a tensor-parallel product leaves each rank the group's T rows of its own columns (its heads);
 * a row operation over all the columns (OLMoE's norm of the whole q projection) wants a rank's slice rows of every
 * column. The columns come in blocks of `width`, rank p holding block p / sharing (sharing: how many consecutive
 * ranks hold the same block, as kv heads replicated over tp / KV ranks; 1: each rank its own), so the group holds
 * tp / sharing distinct blocks, N = (tp / sharing) width columns in all. Both moves are all-to-alls over the group
 * (exact: no arithmetic, any row's values whatever the layout) and strided copies; at tp 1 a copy. */

/* slice_all[T / tp, N]: this rank's slice rows with every block's columns, block b at columns [b width, (b + 1) width),
 * from each rank's local[T, width] (the group's rows of its block; of a block's holders the first sends), landing in
 * recv [T, width] first. */
moe_status moe_tp_slice_all_columns(const moe_tp_sequence *s, const moe_real *local, int T, int width, int sharing,
                                    moe_real *recv, moe_real *slice_all);
/* Its inverse: local[T, width] = the group's rows of this rank's block, from every rank's slice_all[T / tp, N],
 * packed into send [T, width] first (each rank's part of it). */
moe_status moe_tp_own_columns(const moe_tp_sequence *s, const moe_real *slice_all, int T, int width, int sharing,
                              moe_real *send, moe_real *local);

#endif
