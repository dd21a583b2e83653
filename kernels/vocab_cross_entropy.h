/* vocab_cross_entropy.h — the per-row parts of the vocabulary-parallel cross-entropy (tp/vocab_cross_entropy.h, which
 * runs the exchanges between them). CPU and CUDA. A rank's logits [T, width] are vocabulary columns [first, first +
 * width); the pieces are [j piece, (j + 1) piece) of them (piece divides width).
 *   row max        max[t] = the largest of row t
 *   piece sums     sums[j T + t] = sum over piece j's columns of exp(l - max[t]), in double, in a fixed order: the CPU
 *                  adds in kernels/row_reduce.h's lanes from the piece's first column (one piece is
 *                  kernels/cross_entropy_cpu.c's sum, bit for bit); CUDA adds
 *                  each piece with one block of 256 threads (strided, then the block's fixed order: one piece of the
 *                  whole row is kernels/cross_entropy.cu's sum). target[t] = the target's logit (double) where this
 *                  rank holds its column, else 0
 *   backward       l = scale (exp(l - max[t]) / z[t] - [column == target]), in place, with
 *                  kernels/cross_entropy's roundings: the exps stored, multiplied by (float)(scale / z), scale
 *                  subtracted at the target
 * The order of every sum depends on the piece width alone, so results are the same bits whichever rank holds a piece.
 * Targets must be in [0, V) (the caller checks). */
#ifndef MOE_KERNELS_VOCAB_CROSS_ENTROPY_H
#define MOE_KERNELS_VOCAB_CROSS_ENTROPY_H

#include "core/gpu.h"
#include "core/types.h"

void moe_vocab_row_max_cpu(const moe_real *logits, int num_tokens, int width, moe_real *max);
void moe_vocab_piece_sums_cpu(const moe_real *logits, const moe_real *max, const int *targets, int num_tokens,
                              int width, int piece, int first, double *sums, double *target);
void moe_vocab_backward_cpu(moe_real *logits, const moe_real *max, const double *z, const int *targets, int num_tokens,
                            int width, int first, moe_real scale);

/* CUDA: device pointers, queued on gpu's stream, no host sync. */
moe_status moe_vocab_row_max_cuda(moe_gpu *gpu, const float *logits, int num_tokens, int width, float *max);
moe_status moe_vocab_piece_sums_cuda(moe_gpu *gpu, const float *logits, const float *max, const int *targets,
                                     int num_tokens, int width, int piece, int first, double *sums, double *target);
moe_status moe_vocab_backward_cuda(moe_gpu *gpu, float *logits, const float *max, const double *z, const int *targets,
                                   int num_tokens, int width, int first, float scale);

#endif
